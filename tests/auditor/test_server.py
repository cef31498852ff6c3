"""``run``'s HTTP server over real HTTP on loopback: ``/metrics``, ``/healthz`` and its window, anything else."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from gpu_fence.auditor.audit import audit
from gpu_fence.auditor.metrics import CONTENT_TYPE, AuditorMetrics
from gpu_fence.auditor.model import Gpu, NodeSnapshot
from gpu_fence.auditor.server import Health, serve_http


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of one GET, whatever the status."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[str, Health, Clock]]:
    clock = Clock()
    health = Health(interval=10, unhealthy_after=3, clock=clock)
    metrics = AuditorMetrics("node-a")
    snapshot = NodeSnapshot("node-a", 0.0, (Gpu("GPU-0", 0, 0, "H100", 80 << 30),), (), ())
    metrics.observe(snapshot, audit(snapshot), 0.01)
    server = serve_http("127.0.0.1", 0, metrics, health)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", health, clock
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_are_served_in_the_text_exposition_format(served):
    url, _, _ = served
    status, content_type, body = get(url + "/metrics")
    assert (status, content_type) == (200, CONTENT_TYPE)
    assert 'gpu_fence_gpu_info{gpu_uuid="GPU-0"' in body and "gpu_fence_audit_cycle_duration_seconds_count 1.0" in body


def test_healthz_follows_the_health_window(served):
    url, health, clock = served
    assert get(url + "/healthz?verbose=1") == (200, "text/plain; charset=utf-8", "starting: no cycle completed yet\n")
    clock.now += 31
    health.last_error = "kubelet PodResources API unavailable"
    status, _, body = get(url + "/healthz")
    assert status == 503 and body == "no successful audit cycle in 31s: kubelet PodResources API unavailable\n"
    health.last_success = clock.now
    assert get(url + "/healthz")[:2] == (200, "text/plain; charset=utf-8")


def test_any_other_path_is_a_404_that_names_the_two_endpoints(served):
    url, _, _ = served
    assert get(url + "/") == (404, "text/plain; charset=utf-8", "not found: try /metrics or /healthz\n")


def test_an_address_in_use_is_an_os_error_for_the_caller_to_report():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(OSError):
            serve_http("127.0.0.1", taken.getsockname()[1], AuditorMetrics("n"), Health(1, 1))
    finally:
        taken.close()


def test_health_window():
    now = [100.0]
    health = Health(interval=10, unhealthy_after=3, clock=lambda: now[0])
    assert health.check()[0] == 200  # starting
    now[0] = 131
    health.last_error = "kubelet down"
    assert health.check() == (503, "no successful audit cycle in 31s: kubelet down")
    health.last_success = 130
    assert health.check()[0] == 200
    now[0] = 161
    code, message = health.check()
    assert code == 503 and "31s ago" in message
