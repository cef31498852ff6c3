"""Throughput after a worker is killed (SIGKILL) under keep-alive load: how soon the replacement gets its share back.

The servers of ``bench.https_bench`` (default ``serve`` and ``gthread``) run side by side, one after the other under
the same load: ``--connections`` closed-loop clients (``bench.loadgen.Client``), each on one kept-alive
connection, POST ``/validate`` with a 10-container pod as fast as answers come, and reconnect at once when a
connection is closed or broken, as the API server's HTTP client does. After ``--before`` seconds a worker (the
first; ``serve``'s only one by default) is killed with SIGKILL; gunicorn's master starts a replacement.
Completions are counted per ``--bucket`` seconds. Reported per server:

* the throughput before the kill (median of the buckets after a one-second warm-up);
* the throughput over the last ``--tail`` seconds, and its ratio to the one before;
* how long after the kill the throughput (over a sliding second) first reached 90 % of the one before (absent
  when it never did): a replacement that gets no traffic back can still touch it when the machine's neighbours
  pause, so read it with the next two;
* where the clients' connections are at the end: how many each worker holds.

Run: ``python -m bench.recovery_bench`` (``--help`` for durations); about 1 minute. Loopback only.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import https_bench, loadgen, machine, reviews

RECOVERED = 0.9


def connections_per_worker(server: https_bench.Server) -> dict[int, int]:
    """How many established connections on the server's port each worker holds."""
    return {pid: machine.established_connections(pid, server.port) for pid in machine.children_of(server.process.pid)}


def run_one(
    server: https_bench.Server, *, connections: int, before: float, after: float, bucket: float, tail: float
) -> dict[str, Any]:
    request, uid_at = loadgen.request_bytes(server.target, "/validate", reviews.validate_body(10), keep_alive=True)
    context = server.target.context()
    stop = threading.Event()
    start = time.monotonic()
    total = before + after
    counts = [0] * (int(total / bucket) + 2)
    failures = [0]
    opened = [0] * connections

    def client(lane: int) -> None:
        data = bytearray(request)
        conn = loadgen.Client(server.target, context)
        number = lane
        while not stop.is_set():
            try:
                if uid_at >= 0:
                    data[uid_at + 24 : uid_at + 36] = b"%012d" % number
                status = conn.exchange(bytes(data))
                if status == 200:
                    slot = int((time.monotonic() - start) / bucket)
                    if slot < len(counts):
                        counts[slot] += 1
                number += connections
            except (OSError, loadgen.LoadError, ValueError, IndexError):
                failures[0] += 1
                conn.close()  # the next exchange reconnects at once
        opened[lane] = conn.connects
        conn.close()

    threads = [threading.Thread(target=client, args=(lane,), daemon=True) for lane in range(connections)]
    for thread in threads:
        thread.start()
    time.sleep(before)  # load before the kill
    workers = machine.children_of(server.process.pid)
    if not workers:
        raise https_bench.BenchError(f"the {server.name} server has no worker to kill")
    victim = workers[0]
    killed_at = time.monotonic() - start
    os.kill(victim, signal.SIGKILL)
    time.sleep(after)
    held = connections_per_worker(server)
    stop.set()
    for thread in threads:
        thread.join(timeout=20)
    rates = [count / bucket for count in counts[: int(total / bucket)]]
    warm = int(1.0 / bucket)
    kill_slot = int(killed_at / bucket)
    before_rate = statistics.median(rates[warm:kill_slot]) if kill_slot > warm else 0.0
    tail_rate = statistics.median(rates[-int(tail / bucket) :])
    window = max(1, int(1.0 / bucket))
    smoothed = [statistics.fmean(rates[i : i + window]) for i in range(kill_slot, len(rates) - window + 1)]
    recovered_after = next(
        (offset * bucket for offset, rate in enumerate(smoothed) if rate >= RECOVERED * before_rate), None
    )
    return {
        "server": server.name,
        "before_per_s": before_rate,
        "tail_per_s": tail_rate,
        "tail_vs_before": tail_rate / before_rate if before_rate else 0.0,
        "recovered_after_s": recovered_after,
        "failed_requests": failures[0],
        "connections_opened": sum(opened),
        "connections_per_worker": sorted(held.values(), reverse=True),
        "rates_per_s": rates,
        "killed_at_s": killed_at,
    }


def run(
    *,
    names: Sequence[str],
    connections: int,
    before: float,
    after: float,
    bucket: float,
    tail: float,
    workdir: Path,
) -> dict[str, Any]:
    results = []
    with https_bench.servers(workdir, names) as running:
        for server in running.values():  # warm up every worker
            loadgen.open_loop(server.target, "/validate", reviews.validate_body(10), rate=200, seconds=0.5)
        for server in running.values():
            results.append(
                run_one(server, connections=connections, before=before, after=after, bucket=bucket, tail=tail)
            )
    return {
        "benchmark": "recovery",
        "connections": connections,
        "before_s": before,
        "after_s": after,
        "bucket_s": bucket,
        "tail_s": tail,
        "results": results,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| server | before the kill (reviews/s) | last "
        f"{report['tail_s']:g} s (reviews/s) | ratio | back to 90 % after | failed requests | connections per worker "
        "at the end |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in report["results"]:
        recovered = "never" if row["recovered_after_s"] is None else f"{row['recovered_after_s']:.1f} s"
        lines.append(
            f"| {row['server']} | {row['before_per_s']:,.0f} | {row['tail_per_s']:,.0f} | {row['tail_vs_before']:.2f} "
            f"| {recovered} | {row['failed_requests']} | {', '.join(map(str, row['connections_per_worker']))} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="serve,gthread", help="comma-separated (default: serve,gthread)")
    parser.add_argument("--connections", type=int, default=8, help="kept-alive client connections (default: 8)")
    parser.add_argument("--before", type=float, default=5.0, help="seconds of load before the kill (default: 5)")
    parser.add_argument("--after", type=float, default=20.0, help="seconds of load after the kill (default: 20)")
    parser.add_argument("--bucket", type=float, default=0.25, help="seconds per throughput sample (default: 0.25)")
    parser.add_argument("--tail", type=float, default=5.0, help="seconds at the end compared (default: 5)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = parser.parse_args(argv)
    args.servers = args.servers.split(",")
    unknown = set(args.servers) - set(https_bench.VARIANTS)
    if unknown:
        parser.error(f"--servers: unknown {sorted(unknown)}; choose from {', '.join(https_bench.VARIANTS)}")
    if args.connections < 1 or min(args.before, args.after, args.bucket, args.tail) <= 0:
        parser.error("--connections must be >= 1 and --before, --after, --bucket, --tail > 0")
    if args.before < 1 + 2 * args.bucket or args.tail > args.after:
        parser.error("--before must leave a second of warm-up and samples; --tail must fit in --after")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    in_workdir = functools.partial(
        run,
        names=args.servers,
        connections=args.connections,
        before=args.before,
        after=args.after,
        bucket=args.bucket,
        tail=args.tail,
    )
    return https_bench.run_and_publish("recovery_bench", in_workdir, markdown, args.json)


if __name__ == "__main__":
    sys.exit(main())
