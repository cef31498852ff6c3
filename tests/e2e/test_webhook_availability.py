"""No client that can connect stops the webhook: each way of holding or flooding it, over real TLS, while reviews
arrive as the API server sends them, and every one of those is answered within the API server's timeout.

``serve`` runs with the manifests' settings (serve's defaults). The attacker (``tests.fakes.slow_clients``)
connects from 127.0.0.2, the API server's role from 127.0.0.1: the server tells clients apart by address, as it
would tell a pod from the API server. Meanwhile reviews arrive at 10/s, each on a fresh connection (the worst case
for the API server: every one needs a free slot and a TLS handshake), and each must be answered within 3 s (the
webhooks' timeoutSeconds) with the right verdict. Outcomes are asserted here, never speed: the latencies under
each attack are measured by ``bench/availability_bench.py`` (BENCHMARKS.md).
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import reviews
from gpu_fence.webhook.reasons import DropReason
from gpu_fence.webhook.worker import WEBHOOK_TIMEOUT_SECONDS
from gpu_fence.webhook.wsgi import MAX_BODY_BYTES
from tests.fakes.polling import wait_for
from tests.fakes.slow_clients import MALFORMED, Attack, exchange, post_head
from tests.fakes.webhook_server import HOSTNAME, Server, send, serving

pytestmark = pytest.mark.e2e

REPO = Path(__file__).parents[2]
FIXTURES = REPO / "tests" / "webhook" / "admissionreviews"
REVIEW_RATE = 10  # reviews per second while the attack runs
REVIEW_SECONDS = 4
#: a 200 kB review: over the size the worker reads without a memory reservation
LARGE_REVIEW = reviews.largest_review(200_000)


@pytest.fixture(scope="module", autouse=True)
def enough_descriptors() -> Iterator[None]:
    """A thousand attacking connections and their server ends need more than the usual 1,024 descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def server(tmp_path_factory, enough_descriptors) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("available")) as started:
        yield started


def fixture(name: str) -> dict:
    document = json.loads((FIXTURES / f"{name}.json").read_text())
    document["request"]["uid"] = str(uuid.uuid4())
    return document


def dropped(server: Server) -> dict[str, float]:
    """``gpu_fence_webhook_connections_dropped_total`` by reason."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(server.get("/metrics").document["text"]):
        for sample in family.samples:
            if sample.name == "gpu_fence_webhook_connections_dropped_total":
                found[sample.labels["reason"]] = sample.value
    return found


def typical_review() -> tuple[bytes, Callable[[dict], bool]]:
    return json.dumps(fixture("pod-create-replicaset-gpu-mix")).encode(), lambda answer: not answer["allowed"]


def large_review() -> tuple[bytes, Callable[[dict], bool]]:
    return LARGE_REVIEW, lambda answer: answer["uid"] == json.loads(LARGE_REVIEW)["request"]["uid"]


def reviews_as_the_api_server_sends_them(
    server: Server, review: Callable[[], tuple[bytes, Callable[[dict], bool]]] = typical_review
) -> list[str]:
    """REVIEW_RATE reviews a second for REVIEW_SECONDS from 127.0.0.1, each on a fresh connection with the API
    server's 3 s budget; the problems seen (none when every review was answered in time with the right answer)."""
    problems: list[str] = []
    start = time.monotonic()
    for number in range(REVIEW_RATE * REVIEW_SECONDS):
        delay = start + number / REVIEW_RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # pacing to the schedule
        body, right = review()
        sent = time.monotonic()
        try:
            reply = server.post("/validate", body, timeout=WEBHOOK_TIMEOUT_SECONDS)
        except (OSError, http.client.HTTPException) as error:
            problems.append(f"review {number}: {type(error).__name__}: {error}")
            continue
        if reply.status != 200 or not right(reply.document["response"]):
            problems.append(f"review {number}: HTTP {reply.status} {str(reply.document)[:200]}")
        elif time.monotonic() - sent > WEBHOOK_TIMEOUT_SECONDS:
            problems.append(f"review {number}: answered after {time.monotonic() - sent:.1f} s")
    return problems


def attack(server: Server, kind: str, count: int, interval: float = 2.0) -> Attack:
    return Attack("127.0.0.1", server.port, HOSTNAME, server.context, kind, count, interval=interval)


# -- connections held ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "count", "review"),
    [
        ("silent", 320, typical_review),
        ("partial-handshake", 320, typical_review),
        ("trickle-hello", 320, typical_review),
        ("trickle-head", 320, typical_review),
        ("trickle-body", 320, large_review),  # 2 MB at a byte a second
        ("chunked", 320, large_review),  # a chunked body that never ends
        ("fast-then-stall", 16, large_review),  # 3 MB but its last byte: memory held, not a budget
    ],
)
def test_reviews_are_answered_while_clients_hold_connections_mid_request(server, kind, count, review):
    interval = 1.0 if kind == "trickle-body" else 2.0
    with attack(server, kind, count, interval) as held:
        wait_for(lambda: held.opened >= count, f"the attack to open {count} connections", timeout=30)
        problems = reviews_as_the_api_server_sends_them(server, review)
    assert problems == []
    # the server, not the attacker, ended the held connections: at their deadline or at once (chunked: 411)
    assert held.lifetimes, "no held connection was closed by the server"


@pytest.mark.parametrize("count", [256, 1024])
def test_reviews_are_answered_while_a_client_holds_idle_kept_alive_connections(server, count):
    """Connections that made one request each and sit idle: the slots they hold are reclaimed (the longest idle
    first, and past its per-address bound a client's own), so the API server's new connections get in."""
    before = dropped(server)
    with attack(server, "idle", count) as idle:
        wait_for(lambda: idle.opened >= count, f"the attack to open {count} connections", timeout=60)
        wait_for(lambda: idle.idle >= 100, "100 of its connections to be answered and left idle", timeout=30)
        problems = reviews_as_the_api_server_sends_them(server)
    assert problems == []
    after = dropped(server)
    reclaimed = sum(
        after.get(reason, 0) - before.get(reason, 0) for reason in (DropReason.IDLE_EVICTED, DropReason.CLIENT_LIMIT)
    )
    assert reclaimed >= count - 128, f"the server reclaimed {reclaimed} of the attacker's {count} connections"


def test_reviews_are_answered_while_a_client_churns_connections(server):
    with attack(server, "churn", 64) as churn:
        wait_for(lambda: churn.opened >= 640, "the attack to open 640 connections", timeout=60)
        problems = reviews_as_the_api_server_sends_them(server)
    assert problems == []


def test_an_idle_connection_of_the_api_server_outlives_a_client_that_fills_its_own_bound(server):
    """The per-address bound takes the attacker's own idle connections first: the API server's stay open."""
    kept = server.connect()
    try:
        assert send(kept, "GET", "/healthz").status == 200
        with attack(server, "idle", 512) as idle:
            wait_for(lambda: idle.opened >= 512, "the attack to open 512 connections", timeout=60)
        reply = send(kept, "POST", "/validate", json.dumps(fixture("pod-create-replicaset-gpu-mix")).encode())
        assert reply.status == 200 and reply.document["response"]["allowed"] is False
    finally:
        kept.close()


# -- requests that are large, malformed, or cut off by a killed worker --------------------------------------------


def test_malformed_requests_get_4xx_answers_and_reviews_go_on(server):
    statuses: list[int] = []

    def send_malformed() -> None:
        for number in range(512):
            request = MALFORMED[number % len(MALFORMED)]
            statuses.append(exchange("127.0.0.1", server.port, HOSTNAME, server.context, request))

    sender = threading.Thread(target=send_malformed)
    sender.start()
    problems = reviews_as_the_api_server_sends_them(server)
    sender.join(timeout=120)
    assert problems == []
    assert len(statuses) == 512
    assert all(400 <= status < 500 for status in statuses), sorted(set(statuses))  # answered, and never a 5xx
    assert not any("Traceback" in line for line in server.stderr_lines())


def test_large_bodies_from_another_client_delay_no_review(server):
    """1, 3 and 6 MB bodies sent as fast as the network takes them: the 3 MiB limit answers 413 to the last, the
    memory budgets queue the others (those that wait past the request deadline are closed unanswered, as the API
    server would have given up on them), and reviews of every size go on."""
    bodies = [reviews.largest_review(1_000_000), reviews.largest_review(MAX_BODY_BYTES), b"{" * 6_000_000]
    answers: list[int] = []

    def send_large(body: bytes) -> None:
        request = post_head("/mutate", len(body)) + body
        answers.append(exchange("127.0.0.1", server.port, HOSTNAME, server.context, request, shut=False))

    senders = [threading.Thread(target=send_large, args=(bodies[number % 3],)) for number in range(16)]
    for sender in senders:
        sender.start()
    problems = reviews_as_the_api_server_sends_them(server, large_review)
    for sender in senders:
        sender.join(timeout=60)
    assert problems == []
    assert len(answers) == 16 and {200, 413} <= set(answers) <= {0, 200, 413}, answers


def test_a_killed_worker_loses_at_most_the_review_in_flight(tmp_path, enough_descriptors):
    """gunicorn replaces the pod's one worker at once; reviews that arrive meanwhile wait in the listen backlog."""
    with serving(tmp_path) as server:
        [worker] = server.workers()
        killer = threading.Timer(1.5, os.kill, args=(worker, signal.SIGKILL))
        killer.start()
        problems = reviews_as_the_api_server_sends_them(server)
        killer.join()
        assert worker not in server.workers()
    assert len(problems) <= 1, problems  # one sent just before the kill may die with the process


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


def test_an_idle_connection_is_closed_after_the_idle_timeout(tmp_path):
    with serving(tmp_path, "--idle-timeout", "1") as server:
        conn = server.connect()
        try:
            assert send(conn, "GET", "/healthz").status == 200
            conn.sock.settimeout(10)
            started = time.monotonic()
            assert conn.sock.recv(1) == b""  # closed by the server
            assert 0.5 < time.monotonic() - started < 5
        finally:
            conn.close()


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
        concurrency = 8  # twice the threads
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
