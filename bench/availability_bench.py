"""The webhook's reviews under attack: for each way a client that can connect tries to stop it, the reviews failed
and the latency of the API server's reviews, server beside server in one run.

Per server (``bench.https_bench``'s ``serve`` and ``gthread``, and with ``--baseline DIR`` the ``serve`` of another
checkout installed in DIR: ``pip install --no-deps --target DIR CHECKOUT``), per row, one after the other: the
attack starts from 127.0.0.2 (``tests.fakes.slow_clients``), and once it holds its connections the API server's
role, on 127.0.0.1, sends ``--rate`` reviews a second for ``--seconds`` (open loop: each review at its scheduled
time on a fresh connection, or with ``--keep-alive`` on a kept-alive one as Go's client picks it; latency counted
from that time, 3 s allowed as the API server allows). A review fails
when it is not answered 200 with the right answer within 3 s. Rows: the slow clients of the e2e tests (silent, half
a ClientHello, a ClientHello or a head trickled a byte every 2 s, a 2 MB body at a byte a second, a chunked body that
never ends, a 3 MB body without its last byte), idle kept-alive connections, churning connections, malformed
requests, large bodies, and a worker killed; and ``none``, the same reviews without an attack. Body rows send 200 kB
reviews (the densest pod shape: the most parsing per byte), the others a typical one.

Run: ``python -m bench.availability_bench`` (``--help``); about a minute per server and row set.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import resource
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import https_bench, machine, reviews
from bench.stats import latency_summary
from tests.fakes.slow_clients import MALFORMED, Attack, exchange, post_head
from tests.fakes.webhook_server import HOSTNAME, Connection, send

TIMEOUT_S = 3.0  # the webhooks' timeoutSeconds
LARGE_REVIEW = reviews.largest_review(200_000)
FIXTURE = Path(__file__).parents[1] / "tests" / "webhook" / "admissionreviews" / "pod-create-replicaset-gpu-mix.json"
#: row -> (attack kind or another disturbance, connections, 200 kB reviews)
ROWS = {
    "none": ("none", 0, False),
    "none-200kB": ("none", 0, True),
    "silent-320": ("silent", 320, False),
    "half-hello-320": ("partial-handshake", 320, False),
    "trickle-hello-320": ("trickle-hello", 320, False),
    "trickle-head-320": ("trickle-head", 320, False),
    "trickle-body-320": ("trickle-body", 320, True),
    "chunked-320": ("chunked", 320, True),
    "fast-then-stall-16": ("fast-then-stall", 16, True),
    "idle-256": ("idle", 256, False),
    "idle-1024": ("idle", 1024, False),
    "churn-64": ("churn", 64, False),
    "malformed-512": ("malformed", 512, False),
    "large-16": ("large", 16, True),
    "kill": ("kill", 0, False),
}


def review_body(large: bool) -> tuple[bytes, str]:
    if large:
        return LARGE_REVIEW, json.loads(LARGE_REVIEW)["request"]["uid"]
    document = json.loads(FIXTURE.read_text())
    document["request"]["uid"] = str(uuid.uuid4())
    return json.dumps(document).encode(), document["request"]["uid"]


def api_server_reviews(
    server: https_bench.Server, *, rate: float, seconds: float, large: bool, keep_alive: bool
) -> dict[str, Any]:
    """Reviews at ``rate``/s for ``seconds``, each at its scheduled time with 3 s allowed: on a fresh connection, or
    with ``keep_alive`` as Go's transport sends them (the most recently used idle connection, else a new one; one
    the server closed is dropped)."""
    context = server.target.context()
    latencies: list[float] = []
    failures: list[str] = []
    idle: list[Connection] = []
    start = time.monotonic() + 0.05

    def one(scheduled: float) -> None:
        body, uid = review_body(large)
        try:
            conn = idle.pop() if keep_alive else None
        except IndexError:
            conn = None
        conn = conn or Connection(server.port, context, timeout=TIMEOUT_S)
        reusable = False
        try:
            reply = send(conn, "POST", "/validate", body)
            elapsed = time.monotonic() - scheduled
            reusable = reply.headers.get("Connection", "").lower() != "close"
            if reply.status != 200 or reply.document["response"]["uid"] != uid:
                failures.append(f"HTTP {reply.status}")
            elif elapsed > TIMEOUT_S:
                failures.append(f"answered after {elapsed:.2f} s")
            else:
                latencies.append(elapsed)
        except (OSError, http.client.HTTPException, KeyError, ValueError) as error:
            failures.append(type(error).__name__)
        finally:
            if keep_alive and reusable:
                idle.append(conn)
            else:
                conn.close()

    threads = []
    for number in range(int(rate * seconds)):
        scheduled = start + number / rate
        delay = scheduled - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # pacing to the schedule
        thread = threading.Thread(target=one, args=(scheduled,), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout=TIMEOUT_S + 10)
    for conn in idle:
        conn.close()
    summary = latency_summary(latencies) if latencies else {"count": 0}
    return {**summary, "reviews": len(threads), "failed": len(failures), "failures": sorted(set(failures))}


def disturbance(server: https_bench.Server, kind: str, count: int, stop: threading.Event) -> Callable[[], None]:
    """A thread body for the rows that are not held connections: malformed requests, large bodies, a kill."""
    host, port, context = "127.0.0.1", server.port, server.target.context()
    if kind == "malformed":

        def run() -> None:
            for number in range(count):
                if stop.is_set():
                    return
                exchange(host, port, HOSTNAME, context, MALFORMED[number % len(MALFORMED)])

    elif kind == "large":
        bodies = [reviews.largest_review(1_000_000), reviews.largest_review(3 * 2**20), b"{" * 6_000_000]

        def run() -> None:
            senders = [
                threading.Thread(
                    target=exchange,
                    args=(host, port, HOSTNAME, context, post_head("/mutate", len(body)) + body),
                    kwargs={"shut": False},
                    daemon=True,
                )
                for body in (bodies * count)[:count]
            ]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join(timeout=60)

    else:  # kill: one worker, a second into the reviews

        def run() -> None:
            if not stop.wait(1.0):
                os.kill(machine.children_of(server.process.pid)[0], signal.SIGKILL)

    return run


def run_row(server: https_bench.Server, row: str, *, rate: float, seconds: float, keep_alive: bool) -> dict[str, Any]:
    kind, count, large = ROWS[row]
    started = time.monotonic()
    if kind == "none":  # the reference: the same reviews with no attack
        figures = api_server_reviews(server, rate=rate, seconds=seconds, large=large, keep_alive=keep_alive)
    elif kind in ("malformed", "large", "kill"):
        stop = threading.Event()
        thread = threading.Thread(target=disturbance(server, kind, count, stop), daemon=True)
        thread.start()
        figures = api_server_reviews(server, rate=rate, seconds=seconds, large=large, keep_alive=keep_alive)
        stop.set()
        thread.join(timeout=60)
        if kind == "kill":
            https_bench.wait_ready(server)  # the replacement, before the next row
    else:
        attack = Attack("127.0.0.1", server.port, HOSTNAME, server.target.context(), kind, count)
        attack.interval = 1.0 if kind == "trickle-body" else 2.0
        with attack:
            deadline = time.monotonic() + 60
            held = min(count, 100) if kind == "idle" else 0  # idle rows: once it holds connections answered
            while (attack.opened < count or attack.idle < held) and time.monotonic() < deadline:
                time.sleep(0.1)  # polling the attack's progress, bounded
            figures = api_server_reviews(server, rate=rate, seconds=seconds, large=large, keep_alive=keep_alive)
        figures["attack_opened"] = attack.opened
    workers = machine.children_of(server.process.pid)
    figures["worker_rss_mib"] = sum(machine.rss_bytes(pid) for pid in workers) / 2**20
    figures["keep_alive"] = keep_alive
    return {"server": server.name, "row": row, "seconds_total": time.monotonic() - started, **figures}


def start_baseline(tls: Path, workdir: Path, site: Path) -> https_bench.Server:
    """``serve`` of another checkout installed in ``site`` (its own defaults: what it ran in production)."""
    return https_bench.start_server(tls, workdir, "serve", workers=None, label="baseline", pythonpath=site)


def run(
    *,
    names: Sequence[str],
    rows: Sequence[str],
    baseline: Path | None,
    rate: float,
    seconds: float,
    keep_alive: bool,
    workdir: Path,
) -> dict[str, Any]:
    results = []
    tls = https_bench.make_certs(workdir / "tls")
    starters: list[Callable[[], https_bench.Server]] = [
        functools.partial(https_bench.start_server, tls, workdir, name, workers=None) for name in names
    ]
    if baseline is not None:
        starters.append(functools.partial(start_baseline, tls, workdir, baseline))
    for start in starters:  # one server at a time: the others would share the two CPUs
        server = start()
        try:
            for row in rows:
                results.append(run_row(server, row, rate=rate, seconds=seconds, keep_alive=keep_alive))
                print(json.dumps({k: v for k, v in results[-1].items() if k != "failures"}), file=sys.stderr)
                if server.process.poll() is not None:  # the attack took the whole server down: a new one
                    results[-1]["server_exited"] = True
                    https_bench.stop_server(server)
                    server = start()
        finally:
            https_bench.stop_server(server)
    return {"benchmark": "availability", "rate": rate, "seconds": seconds, "keep_alive": keep_alive, "results": results}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| server | attack | reviews | failed | p50 ms | p99 ms | max ms | workers' RSS after, MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        figures = [f"{row[key]:,.0f}" if key in row else "-" for key in ("p50_ms", "p99_ms", "max_ms")]
        figures.append(f"{row['worker_rss_mib']:.0f}" + (" (server exited)" if row.get("server_exited") else ""))
        lines.append(f"| {row['server']} | {row['row']} | {row['reviews']} | {row['failed']} | {' | '.join(figures)} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.availability_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="serve", help="comma-separated, of serve, gthread (default: serve)")
    parser.add_argument("--baseline", type=Path, help="also the serve installed in this directory (--target)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated (default: all: {','.join(ROWS)})")
    parser.add_argument("--rate", type=float, default=20.0, help="API server reviews per second (default: 20)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of reviews per row (default: 10)")
    parser.add_argument(
        "--keep-alive",
        action="store_true",
        help="the API server's reviews reuse connections as Go's client does (default: a fresh connection each)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = parser.parse_args(argv)
    args.servers = [name for name in args.servers.split(",") if name]
    args.rows = args.rows.split(",")
    if set(args.servers) - {"serve", "gthread"} or set(args.rows) - set(ROWS):
        parser.error(f"--servers: serve, gthread; --rows: {', '.join(ROWS)}")
    if args.rate <= 0 or args.seconds <= 0:
        parser.error("--rate and --seconds must be > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # a thousand attacking connections, and their server ends in the servers this process starts
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    in_workdir = functools.partial(
        run,
        names=args.servers,
        rows=args.rows,
        baseline=args.baseline,
        rate=args.rate,
        seconds=args.seconds,
        keep_alive=args.keep_alive,
    )
    return https_bench.run_and_publish("availability_bench", in_workdir, markdown, args.json)


if __name__ == "__main__":
    sys.exit(main())
