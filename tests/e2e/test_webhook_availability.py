"""The webhook stays available over real TLS while clients try to tie it up, loses no traffic share to a killed
worker, and stays within the manifests' memory limit under the largest reviews.

``serve`` runs with the production settings (2 workers x 4 threads). Attackers (``tests.fakes.slow_clients``)
hold connections that trickle a request head, trickle a body, stop in the middle of a TLS handshake or say
nothing; meanwhile reviews arrive at 10/s over fresh connections, as the API server sends them, and each must be
answered within 3 s (the webhooks' timeoutSeconds). Bounds are generous on purpose: availability is asserted
here, speed is measured by ``bench/https_bench.py``.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import machine, reviews
from gpu_fence.webhook.worker import WEBHOOK_TIMEOUT_SECONDS
from gpu_fence.webhook.wsgi import MAX_BODY_BYTES
from tests.fakes.slow_clients import Attack
from tests.fakes.webhook_server import HOSTNAME, Server, send, serving

pytestmark = pytest.mark.e2e

REPO = Path(__file__).parents[2]
FIXTURES = REPO / "tests" / "webhook" / "admissionreviews"
REVIEW_RATE = 10  # reviews per second while the attack runs
REVIEW_SECONDS = 4


def fixture(name: str) -> dict:
    document = json.loads((FIXTURES / f"{name}.json").read_text())
    document["request"]["uid"] = str(uuid.uuid4())
    return document


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("available")) as started:
        yield started


def dropped(server: Server, reason: str) -> float:
    text = server.get("/metrics").document["text"]
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpu_fence_webhook_connections_dropped_total" and sample.labels == {"reason": reason}:
                return sample.value
    return 0.0


def reviews_at_10_per_second(server: Server) -> list[str]:
    """Send REVIEW_RATE reviews a second for REVIEW_SECONDS, each on a fresh connection with the API server's 3 s
    budget; the problems seen (an empty list when every review was answered in time with the right verdict)."""
    problems: list[str] = []
    start = time.monotonic()
    for number in range(REVIEW_RATE * REVIEW_SECONDS):
        delay = start + number / REVIEW_RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # pacing to the schedule
        review = fixture("pod-create-replicaset-gpu-mix")
        try:
            reply = server.post("/validate", review, timeout=WEBHOOK_TIMEOUT_SECONDS)
        except (OSError, http.client.HTTPException) as error:
            problems.append(f"review {number}: {type(error).__name__}: {error}")
            continue
        if reply.status != 200 or reply.document["response"]["allowed"] is not False:
            problems.append(f"review {number}: HTTP {reply.status} {reply.document}")
    return problems


def wait_for(condition, seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)  # polling the condition, bounded by the deadline


@pytest.mark.parametrize(
    ("kind", "count"),
    [("trickle-head", 8), ("trickle-head", 64), ("partial-handshake", 64), ("silent", 64)],
)
def test_reviews_are_answered_while_connections_are_held(server, kind, count):
    before = dropped(server, "request-deadline")
    attack = Attack("127.0.0.1", server.port, HOSTNAME, server.context, kind, count)
    with attack:
        wait_for(lambda: attack.opened >= count, 20, f"the attack opened only {attack.opened} connections")
        problems = reviews_at_10_per_second(server)
    assert problems == []
    # the server, not the attacker, ended the held connections: at their deadline, counted
    assert attack.lifetimes, "no held connection was closed by the server"
    assert max(closed - opened for opened, closed in attack.lifetimes) < WEBHOOK_TIMEOUT_SECONDS + 2
    assert dropped(server, "request-deadline") - before >= len(attack.lifetimes)


def test_large_bodies_that_trickle_delay_no_typical_review(server):
    """Bodies over the small-body size wait for the worker's budget; trickling ones hold it until their deadline,
    but reviews of typical size never wait for it."""
    attack = Attack("127.0.0.1", server.port, HOSTNAME, server.context, "trickle-body", 16)
    with attack:
        wait_for(lambda: attack.opened >= 16, 20, f"the attack opened only {attack.opened} connections")
        problems = reviews_at_10_per_second(server)
    assert problems == []
    assert attack.lifetimes and max(closed - opened for opened, closed in attack.lifetimes) < 5


def test_a_kept_alive_connection_past_its_age_is_closed_with_an_answer(tmp_path):
    age = 2.0
    with serving(tmp_path, "--max-connection-age", f"{age:g}") as server:
        conn = server.connect()
        try:
            first = send(conn, "GET", "/healthz")
            assert first.headers.get("Connection", "keep-alive").lower() == "keep-alive"
            time.sleep(age)  # the connection's age is what is tested
            last = send(conn, "GET", "/healthz")
            assert last.status == 200 and last.headers["Connection"].lower() == "close"
        finally:
            conn.close()


# -- the workers' shares of the kept-alive connections --------------------------------------------------------------


class KeepAliveClients:
    """Eight clients that each keep one connection and send a review every 0.1 s on it, reconnecting when the
    server closes it (as Go's HTTP client does) or when it breaks. At 10 reviews/s, no connection reaches its
    request limit within a test, and the servers here set a ten-minute age: neither can be what moves a client."""

    def __init__(self, server: Server, count: int = 8) -> None:
        self.server = server
        self.stop = threading.Event()
        self.answered = [0] * count
        self.failures: list[str] = []
        self.body = json.dumps(fixture("pod-create-kubectl")).encode()
        self.threads = [threading.Thread(target=self._client, args=(lane,)) for lane in range(count)]

    def _client(self, lane: int) -> None:
        conn = self.server.connect()
        while not self.stop.is_set():
            try:
                reply = send(conn, "POST", "/validate", self.body)
                if reply.status == 200:
                    self.answered[lane] += 1
            except (OSError, http.client.HTTPException) as error:  # a killed worker's connections
                self.failures.append(repr(error))
                conn.close()
                conn = self.server.connect()
            self.stop.wait(0.1)
        conn.close()

    def held(self) -> dict[int, int]:
        """Each worker's established connections now."""
        return {pid: machine.established_connections(pid, self.server.port) for pid in self.server.workers()}

    def __enter__(self) -> KeepAliveClients:
        for thread in self.threads:
            thread.start()
        wait_for(lambda: sum(self.answered) >= 100, 30, "no keep-alive traffic")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=20)


def test_the_workers_even_out_their_kept_alive_connections(tmp_path):
    """Whichever worker is first in accept wins a connection, often the one already busy; the roster evens it out."""
    with serving(tmp_path, "--max-connection-age", "600") as server, KeepAliveClients(server) as clients:
        wait_for(
            lambda: sorted(clients.held().values()) in ([4, 4], [3, 5]),
            15,
            f"the workers' connections stayed uneven: {clients.held()}",
        )
        served = sum(clients.answered)
        wait_for(lambda: sum(clients.answered) >= served + 100, 30, "traffic stalled")
    assert clients.failures == []


def test_a_replaced_worker_gets_kept_alive_traffic_back_at_once(tmp_path):
    """The replacement holds its share within seconds, long before any connection reaches its age (here ten
    minutes) or its request limit: whichever worker the killed one's clients reconnect to, the roster evens it."""
    with serving(tmp_path, "--max-connection-age", "600") as server, KeepAliveClients(server) as clients:
        wait_for(lambda: min(clients.held().values()) >= 3, 15, f"uneven before the kill: {clients.held()}")
        [victim, survivor] = server.workers()
        os.kill(victim, signal.SIGKILL)
        newcomers: list[int] = []

        def replaced() -> bool:  # one reading of the children: the killed one can linger until reaped
            now = server.workers()
            newcomers[:] = [pid for pid in now if pid not in (victim, survivor)]
            return len(now) == 2 and victim not in now and len(newcomers) == 1

        wait_for(replaced, 30, "no replacement")
        [replacement] = newcomers
        # the killed worker's clients reconnect at once, to the survivor if the replacement is not accepting yet;
        # the survivor, then 3 or more over, accepts no more and retires half the difference on their next answers
        wait_for(
            lambda: machine.established_connections(replacement, server.port) >= 3,
            15,
            f"the replacement got no share back: {clients.held()}",
        )
        served = sum(clients.answered)
        wait_for(lambda: sum(clients.answered) >= served + 100, 30, "traffic stalled after the replacement")
    assert len(clients.failures) <= 8  # at most the requests in flight on the killed worker's connections


# -- memory under the largest reviews -----------------------------------------------------------------------------


def pss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
    return total


def memory_limit_bytes() -> int:
    deployment = yaml.safe_load((REPO / "manifests" / "base" / "webhook-deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    return int(limit[:-2]) * 2**20


def test_the_largest_reviews_at_full_concurrency_fit_the_memory_limit(tmp_path):
    body = reviews.largest_review(MAX_BODY_BYTES)
    assert len(body) > 0.95 * MAX_BODY_BYTES
    with serving(tmp_path) as server:
        concurrency = 2 * 4  # every thread of both workers
        peak = 0
        errors: list[str] = []

        def one() -> None:
            try:
                reply = server.post("/mutate", body, timeout=60)
                if reply.status != 200:
                    errors.append(f"HTTP {reply.status}")
            except (OSError, http.client.HTTPException) as error:
                errors.append(repr(error))

        for _ in range(3):
            senders = [threading.Thread(target=one) for _ in range(concurrency)]
            for sender in senders:
                sender.start()
            while any(sender.is_alive() for sender in senders):
                peak = max(peak, pss_bytes([server.process.pid, *server.workers()]))
                time.sleep(0.02)  # sampling interval of the memory probe
            for sender in senders:
                sender.join()
        assert errors == []
        limit = memory_limit_bytes()
        assert peak < 0.8 * limit, f"PSS peaked at {peak / 2**20:.0f} MiB, the limit is {limit / 2**20:.0f} MiB"
