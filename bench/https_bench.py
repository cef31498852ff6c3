"""The webhook over HTTPS on loopback: throughput at saturation and latency at fixed offered loads.

One run starts, with certificates from ``gpu-fence-webhook certs``, the servers asked for (``bench.server``: the
real ``serve`` plus the no-op endpoint ``/noop``): ``serve`` (what ``serve`` runs: its own worker, 4 threads,
keep-alive, one JSON log line per review), ``gthread`` (the same, with gunicorn's threaded worker instead) and
``sync`` (workers that close every connection); with ``--baseline DIR``, the ``serve`` of another checkout installed
in DIR, beside them (``pip install --no-deps --target DIR CHECKOUT``); on request with
``--servers``, ``serve-quiet`` (``serve`` with ``--log-level WARNING``: what the per-review log line costs) and
``serve-unfrozen`` (``serve`` without the ``gc.freeze()`` before fork). Then, repeat after repeat, side by side:

* **saturation**: Debian's ``wrk`` (closed loop, ``bench/wrk/post.lua``) drives ``/mutate``, ``/validate`` and
  ``/noop`` with the same pod (10 containers unless ``--containers``); throughput and wrk's latency distribution.
  The throughput target is the ratio of ``/mutate`` (and ``/validate``) to ``/noop`` on the same server stack.
* **offered loads** 100, 200 and 500 reviews/s from ``bench.loadgen`` (open loop: latency counted from each
  request's scheduled time), over kept-alive connections and, for ``serve``, with a new TCP connection and a
  full TLS handshake per request (``serve-quiet`` runs saturation only).
* worker RSS of each server after the load.

Figures are medians over repeats; a ratio to ``/noop`` is taken within each repeat, then its median.
Run: ``python -m bench.https_bench`` (``--help`` for sizes and durations).
Loopback only; every step is bounded in time.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import loadgen, machine, reviews
from bench.results import publish, target, target_table
from bench.server import NOOP_PATH
from bench.stats import median_of_runs
from tests.fakes.ports import free_port

# the `certs` and `serve` command lines the end-to-end tests prove, so that the benchmark measures that server
from tests.fakes.processes import stop
from tests.fakes.webhook_server import HOSTNAME, certs_command, serve_options

WRK_SCRIPT = Path(__file__).parent / "wrk" / "post.lua"
ENDPOINTS = ("/mutate", "/validate", NOOP_PATH)
RATES = (100, 200, 500)
READY_DEADLINE_S = 60.0
TARGET_P99_MS = 5.0  # DESIGN: p99 at 200 reviews/s, keep-alive
TARGET_RATE = 200
TARGET_RATIO = 0.8  # DESIGN: throughput >= 0.8x the no-op endpoint on the same server stack
#: server name -> (worker class: serve's own or gunicorn's, serve --log-level, gc.freeze() before fork)
VARIANTS = {
    "serve": ("serve", "INFO", True),
    "gthread": ("gthread", "INFO", True),
    "sync": ("sync", "INFO", True),
    "serve-quiet": ("serve", "WARNING", True),
    "serve-unfrozen": ("serve", "INFO", False),
}
DEFAULT_SERVERS = ("serve", "gthread", "sync")
#: the server the DESIGN targets are judged on
PRODUCTION = "serve"


class BenchError(RuntimeError):
    """The benchmark could not run (a server did not start, a tool is missing); the message says why."""


@dataclass
class Server:
    name: str
    worker_class: str
    port: int
    process: subprocess.Popen
    stderr_path: Path
    target: loadgen.Target
    workers: int
    threads: int
    notes: list[str] = field(default_factory=list)

    def worker_rss(self) -> list[dict[str, int]]:
        return [
            {"pid": pid, "rss_bytes": machine.rss_bytes(pid), "peak_rss_bytes": machine.peak_rss_bytes(pid)}
            for pid in machine.children_of(self.process.pid)
        ]


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise BenchError(f"{name} is not installed (Debian package {name!r}, or pip install -e . for the CLI)")
    return found


def make_certs(directory: Path) -> Path:
    """``gpu-fence-webhook certs`` into ``directory``: ca.crt, tls.crt, tls.key for the Service DNS name."""
    result = subprocess.run(
        certs_command(tool("gpu-fence-webhook"), directory), capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise BenchError(f"gpu-fence-webhook certs failed: {result.stderr.strip()}")
    return directory


def start_server(
    tls: Path,
    workdir: Path,
    name: str,
    *,
    workers: int | None = None,
    threads: int = 4,
    label: str | None = None,
    pythonpath: Path | None = None,
    cpus: str | None = None,
) -> Server:
    """``name``'s server (``VARIANTS``), called ``label`` in the report; ``workers`` None: serve's own default.
    With ``pythonpath``, ``gpu_fence`` comes from there (another checkout, installed with ``pip --target``); with
    ``cpus``, the server runs on those CPUs only (``taskset``: the pod's CPU limit)."""
    worker_class, log_level, gc_freeze = VARIANTS[name]
    label = label or name
    port = free_port()
    stderr_path = workdir / f"serve-{label}.stderr"
    command = [
        *([tool("taskset"), "-c", cpus] if cpus else []),
        sys.executable,
        # as a script, not with -m: -m puts the working directory first on sys.path, where gpu_fence/ would shadow
        # the checkout given in ``pythonpath``
        str(Path(__file__).with_name("server.py")),
        "--worker-class",
        worker_class,
        *([] if gc_freeze else ["--no-gc-freeze"]),
        "serve",
        "--log-level",
        log_level,
        *serve_options(tls, port, workers=workers, threads=threads),
    ]
    paths = [*([str(pythonpath)] if pythonpath else []), str(Path(__file__).parents[1])]
    env = {**os.environ, "TMPDIR": str(workdir), "PYTHONPATH": os.pathsep.join(paths)}
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    target = loadgen.Target("127.0.0.1", port, HOSTNAME, str(tls / "ca.crt"))
    threads = 1 if worker_class == "sync" else threads
    server = Server(label, worker_class, port, process, stderr_path, target, workers or 0, threads)
    try:
        wait_ready(server)
    except BaseException:
        stop_server(server)
        raise
    server.workers = len(machine.children_of(process.pid))
    return server


def wait_ready(server: Server) -> None:
    """Poll ``/readyz`` until it answers 200 on every worker we can reach, or fail with the server's stderr."""
    context = server.target.context()
    deadline = time.monotonic() + READY_DEADLINE_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise BenchError(
                f"the {server.name} server exited with {server.process.returncode}: "
                f"{server.stderr_path.read_text(errors='replace')[-2000:]}"
            )
        connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)
        connection.host = HOSTNAME  # verify for the Service name; connect to loopback
        try:
            connection.sock = context.wrap_socket(
                socket.create_connection(("127.0.0.1", server.port), 5), server_hostname=HOSTNAME
            )
            connection.request("GET", "/readyz")
            if connection.getresponse().status == 200 and len(machine.children_of(server.process.pid)) >= 1:
                return
        except OSError:
            pass
        finally:
            connection.close()
        time.sleep(0.1)  # polling the readiness endpoint, bounded by the deadline
    raise BenchError(f"the {server.name} server was not ready within {READY_DEADLINE_S:.0f} s")


def stop_server(server: Server) -> None:
    stop(server.process, grace_s=30)


def cpu_seconds(pids: Sequence[int]) -> float:
    """User plus system CPU time the processes have used so far (``/proc/<pid>/stat``); 0 for one that is gone."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return total / os.sysconf("SC_CLK_TCK")


def wrk_saturation(server: Server, path: str, body_file: Path, *, seconds: int, connections: int) -> dict[str, Any]:
    """Closed-loop saturation with wrk: requests/s, wrk's latency distribution, and the CPU time the server's
    workers spent per request (steadier than throughput when neighbours take turns on the CPUs: it does not
    count the time the server waited for a CPU)."""
    url = f"https://127.0.0.1:{server.port}"
    command = [
        tool("wrk"),
        "-t1",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        "5s",
        "-s",
        str(WRK_SCRIPT),
        url,
        "--",
        path,
        str(body_file),
    ]
    workers = machine.children_of(server.process.pid)
    cpu_before = cpu_seconds(workers)
    result = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=False)
    cpu_used = cpu_seconds(workers) - cpu_before
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise BenchError(f"wrk failed on {path} ({result.returncode}): {result.stderr.strip() or result.stdout}")
    summary = json.loads(lines[-1])
    errors = summary["errors"]
    if errors["status"] or errors["connect"] or errors["timeout"] or not summary["requests"]:
        raise BenchError(f"wrk on {path}: errors {errors} in {summary['requests']} requests")
    latency = summary["latency_us"]
    return {
        "reviews_per_s": summary["requests"] / (summary["duration_us"] / 1e6),
        "p50_ms": latency["p50"] / 1e3,
        "p99_ms": latency["p99"] / 1e3,
        "max_ms": latency["max"] / 1e3,
        "requests": summary["requests"],
        "read_errors": errors["read"],  # sync workers close after each answer; wrk counts some of those
        "server_cpu_us": cpu_used / summary["requests"] * 1e6,
    }


@contextmanager
def servers(
    workdir: Path,
    names: Sequence[str],
    *,
    workers: int | None = None,
    threads: int = 4,
    baseline: Path | None = None,
    cpus: str | None = None,
) -> Iterator[dict[str, Server]]:
    """The servers named, and with ``baseline`` the ``serve`` installed there (as ``baseline``), all started."""
    tls = make_certs(workdir / "tls")
    started: dict[str, Server] = {}
    try:
        for name in names:
            started[name] = start_server(tls, workdir, name, workers=workers, threads=threads, cpus=cpus)
        if baseline is not None:
            started["baseline"] = start_server(
                tls,
                workdir,
                "serve",
                workers=workers,
                threads=threads,
                label="baseline",
                pythonpath=baseline,
                cpus=cpus,
            )
        yield started
    finally:
        for server in started.values():
            stop_server(server)


def plan(names: Sequence[str], rates: Sequence[int]) -> list[tuple[str, str, str, int | None]]:
    """The (server, mode, endpoint, offered rate or None for saturation) points of one repeat."""
    points: list[tuple[str, str, str, int | None]] = []
    for name in names:
        points += [(name, "saturation", endpoint, None) for endpoint in ENDPOINTS]
        if name == "serve-quiet":
            continue  # there to price the log line at saturation only
        points += [(name, "keep-alive", endpoint, rate) for rate in rates for endpoint in ENDPOINTS]
        if name in (PRODUCTION, "baseline"):  # sync closes every connection anyway: its keep-alive rows are this
            points += [
                (name, "new-connection", endpoint, rate)
                for rate in rates
                if rate <= 200
                for endpoint in ("/mutate", NOOP_PATH)
            ]
    return points


def run(
    *,
    names: Sequence[str],
    rates: Sequence[int],
    containers: int,
    repeats: int,
    saturation_repeats: int,
    seconds: float,
    wrk_seconds: int,
    connections: int,
    workdir: Path,
    workers: int | None = None,
    threads: int = 4,
    baseline: Path | None = None,
    cpus: str | None = None,
) -> dict[str, Any]:
    bodies = {
        "/mutate": reviews.mutate_body(containers),
        "/validate": reviews.validate_body(containers),
        NOOP_PATH: reviews.mutate_body(containers),
    }
    body_files = {}
    for endpoint, body in bodies.items():
        body_files[endpoint] = workdir / f"body{endpoint.replace('/', '-')}.json"
        body_files[endpoint].write_bytes(body)
    points = plan([*names, *(["baseline"] if baseline is not None else [])], rates)
    samples: dict[tuple, list[dict[str, float]]] = {point: [] for point in points}
    with servers(workdir, names, workers=workers, threads=threads, baseline=baseline, cpus=cpus) as running:
        for server in running.values():  # warm up every worker: first requests pay imports and allocator growth
            for endpoint in ENDPOINTS:
                loadgen.open_loop(
                    server.target,
                    endpoint,
                    bodies[endpoint],
                    rate=200.0,
                    seconds=min(seconds, 0.5),
                    connections=connections,
                )
        for number in range(saturation_repeats):
            for name, server in running.items():
                # the three endpoints of one server back to back, so each ratio to /noop compares neighbours in
                # time; the order flips every repeat so that a drifting machine favours no endpoint
                order = ENDPOINTS if number % 2 == 0 else ENDPOINTS[::-1]
                measured = {
                    endpoint: wrk_saturation(
                        server, endpoint, body_files[endpoint], seconds=wrk_seconds, connections=connections
                    )
                    for endpoint in order
                }
                for endpoint, figures in measured.items():
                    figures["throughput_vs_noop"] = figures["reviews_per_s"] / measured[NOOP_PATH]["reviews_per_s"]
                    if figures["server_cpu_us"] > 0:  # the CPU-bound throughput ratio, neighbours' turns left out
                        figures["cpu_vs_noop"] = measured[NOOP_PATH]["server_cpu_us"] / figures["server_cpu_us"]
                    samples[(name, "saturation", endpoint, None)].append(figures)
        for _ in range(repeats):
            for point in points:
                name, mode, endpoint, rate = point
                if mode == "saturation":
                    continue
                samples[point].append(
                    loadgen.open_loop(
                        running[name].target,
                        endpoint,
                        bodies[endpoint],
                        rate=float(rate or 0),
                        seconds=seconds,
                        connections=connections,
                        reuse=mode == "keep-alive",
                    )
                )
        rss = {name: server.worker_rss() for name, server in running.items()}
        config = {
            name: {
                "worker_class": server.worker_class,
                "log_level": VARIANTS.get(name, VARIANTS[PRODUCTION])[1],
                "gc_freeze": VARIANTS.get(name, VARIANTS[PRODUCTION])[2],
                "workers": server.workers,
                "threads": server.threads,
            }
            for name, server in running.items()
        }
    results = []
    for point in points:
        name, mode, endpoint, rate = point
        results.append(
            {
                "server": name,
                "mode": mode,
                "endpoint": endpoint,
                "offered_per_s": rate,
                **median_of_runs(samples[point]),
            }
        )
    return {
        "benchmark": "https",
        "containers": containers,
        "body_bytes": len(bodies["/mutate"]),
        "repeats": repeats,
        "saturation_repeats": saturation_repeats,
        "seconds_per_point": seconds,
        "wrk_seconds": wrk_seconds,
        "connections": connections,
        "servers": config,
        "worker_rss": rss,
        "results": results,
        "targets": targets(results),
    }


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    judged = []
    for row in results:
        if row["server"] != PRODUCTION or row["endpoint"] == NOOP_PATH:
            continue
        if row["mode"] == "keep-alive" and row["offered_per_s"] == TARGET_RATE:
            judged.append(
                target(
                    f"p99 <= {TARGET_P99_MS} ms at {TARGET_RATE} reviews/s, keep-alive ({row['endpoint']})",
                    f"{row['p99_ms']:.2f} ms",
                    row["p99_ms"] <= TARGET_P99_MS,
                )
            )
        if row["mode"] == "saturation" and "throughput_vs_noop" in row:
            ratio = row["throughput_vs_noop"]
            judged.append(
                target(
                    f"throughput >= {TARGET_RATIO}x no-op, same stack ({row['endpoint']})",
                    f"{ratio:.2f}x ({row['reviews_per_s']:,.0f}/s)",
                    ratio >= TARGET_RATIO,
                )
            )
    return judged


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| server | mode | endpoint | offered/s | achieved/s | p50 ms | p99 ms | vs noop |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        achieved = row.get("achieved_per_s", row.get("reviews_per_s", 0))
        ratio = f"{row['throughput_vs_noop']:.2f}" if "throughput_vs_noop" in row else ""
        offered = int(row["offered_per_s"] or 0) or "max"
        lines.append(
            f"| {row['server']} | {row['mode']} | {row['endpoint']} | {offered} "
            f"| {achieved:,.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {ratio} |"
        )
    lines += [
        "",
        "| server | endpoint | server CPU µs per request (saturation) | noop's CPU / this CPU |",
        "|---|---|---:|---:|",
    ]
    for row in report["results"]:
        if row["mode"] == "saturation" and "server_cpu_us" in row:
            ratio = f"{row['cpu_vs_noop']:.2f}" if "cpu_vs_noop" in row else ""
            lines.append(f"| {row['server']} | {row['endpoint']} | {row['server_cpu_us']:.0f} | {ratio} |")
    lines += ["", "| server | worker RSS (MiB) |", "|---|---|"]
    for name, workers in report["worker_rss"].items():
        sizes = ", ".join(f"{worker['rss_bytes'] / 2**20:.1f}" for worker in workers)
        lines.append(f"| {name} | {sizes} |")
    lines += target_table(report["targets"])
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.https_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--servers",
        default=",".join(DEFAULT_SERVERS),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: {','.join(DEFAULT_SERVERS)})",
    )
    parser.add_argument("--rates", default=",".join(map(str, RATES)), help="offered loads (default: 100,200,500)")
    parser.add_argument("--containers", type=int, default=10, help="containers of the reviewed pod (default: 10)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="repeats of the offered loads; medians are reported (default: 3)"
    )
    parser.add_argument(
        "--saturation-repeats",
        type=int,
        default=5,
        help="repeats of the saturation runs; medians of throughput and of the ratio to /noop "
        "within each repeat are reported (default: 5)",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per offered-load point (default: 2)")
    parser.add_argument("--wrk-seconds", type=int, default=2, help="seconds per saturation point (default: 2)")
    parser.add_argument("--connections", type=int, default=8, help="client connections (default: 8)")
    parser.add_argument(
        "--workers", type=int, help="gunicorn workers of every server (default: each serve's own default)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also the serve of another checkout, installed in this directory (pip install --no-deps --target)",
    )
    parser.add_argument("--cpus", help="run the servers on these CPUs only (taskset -c), e.g. 1: a pod's CPU limit")
    parser.add_argument(
        "--threads",
        type=int,
        default=4,
        help="threads per worker (default: 4, serve's default; sync workers have one)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = parser.parse_args(argv)
    try:
        args.rates = [int(rate) for rate in args.rates.split(",")]
    except ValueError:
        parser.error(f"--rates {args.rates!r}: give whole numbers separated by commas, e.g. 100,200,500")
    args.servers = args.servers.split(",")
    unknown = set(args.servers) - set(VARIANTS)
    if unknown:
        parser.error(f"--servers: unknown {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if (
        min(args.rates) < 1
        or min(args.repeats, args.saturation_repeats) < 1
        or args.seconds <= 0
        or min(args.wrk_seconds, args.connections, args.workers or 1, args.threads) < 1
    ):
        parser.error(
            "--rates, --repeats, --saturation-repeats, --wrk-seconds, --connections, --workers and "
            "--threads must be >= 1 and --seconds > 0"
        )
    return args


def run_and_publish(
    prog: str,
    in_workdir: Callable[..., dict[str, Any]],
    markdown: Callable[[dict[str, Any]], str],
    json_path: str | None,
) -> int:
    """``in_workdir(workdir=...)`` in a temporary directory (certificates, server logs), then its report published
    with the machine's description; 2, with one line on stderr, when the benchmark could not run. ``recovery_bench``
    runs this way too."""
    with tempfile.TemporaryDirectory(prefix=f"gpu-fence-{prog.replace('_', '-')}-") as directory:
        try:
            report = in_workdir(workdir=Path(directory))
        except (BenchError, loadgen.LoadError) as error:
            print(f"{prog}: {error}", file=sys.stderr)
            return 2
    report["machine"] = machine.describe()
    publish(report, markdown(report), json_path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    in_workdir = functools.partial(
        run,
        names=args.servers,
        baseline=args.baseline,
        cpus=args.cpus,
        rates=args.rates,
        containers=args.containers,
        repeats=args.repeats,
        saturation_repeats=args.saturation_repeats,
        seconds=args.seconds,
        wrk_seconds=args.wrk_seconds,
        connections=args.connections,
        workers=args.workers,
        threads=args.threads,
    )
    return run_and_publish("https_bench", in_workdir, markdown, args.json)


if __name__ == "__main__":
    sys.exit(main())
