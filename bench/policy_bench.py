"""The admission policy in process: reviews/s and per-review latency for typical pods of 1, 10 and 50 containers.

Measured paths, side by side in each repeat (bodies from ``bench.reviews``):

* ``floor``: parse the AdmissionReview JSON, answer "allowed" with the uid echoed, serialise. The least any
  webhook written in Python with orjson can do per review.
* ``mutate`` / ``validate``: what the server runs per request (``webhook.app`` minus Flask): parse, the envelope
  ``webhook.review.review`` with the real policy, serialise the response.
* ``evaluate``: the policy alone (``webhook.policy.evaluate``: exemption, mutation, validation of the mutated pod)
  on an already parsed pod; DESIGN's "pods/s on one core" target is about this.

The process is pinned to one CPU. After the warm-up, ``gc.freeze()`` moves every object built so far out of the
collector's reach, as ``serve`` does in its master before the workers fork (``--no-gc-freeze`` measures without
it: the cyclic collector then walks the benchmark's own objects too, which makes most of the 50-container tail).
Each repeat runs every path for ``--seconds``; the figures reported are the medians over ``--repeats`` repeats.
Run: ``python -m bench.policy_bench`` (``--help`` for sizes and durations).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from bench import machine, reviews
from bench.results import publish, target, target_table
from bench.stats import latency_summary, median_of_runs, percentile

TARGET_PODS_PER_SECOND = 20_000  # DESIGN: policy evaluation, typical pods, one core
TARGET_P99_MS = 0.2  # DESIGN: p99 for a 10-container pod
PATHS = ("floor", "mutate", "validate", "evaluate")


def build_cases(containers: int) -> dict[str, Callable[[], Any]]:
    """One zero-argument callable per measured path for a pod of ``containers`` containers."""
    from gpu_fence.webhook import policy
    from gpu_fence.webhook.config import load_config
    from gpu_fence.webhook.review import Endpoint, review

    config = load_config(None)
    mutate_body = reviews.mutate_body(containers)
    validate_body = reviews.validate_body(containers)
    parsed_pod = orjson.loads(mutate_body)["request"]["object"]
    loads, dumps = orjson.loads, orjson.dumps

    def floor() -> bytes:
        return dumps(reviews.floor_response(loads(mutate_body)))

    def mutate() -> bytes:
        return dumps(review(loads(mutate_body), Endpoint.MUTATE, config, policy).response)

    def validate() -> bytes:
        return dumps(review(loads(validate_body), Endpoint.VALIDATE, config, policy).response)

    def evaluate() -> Any:
        return policy.evaluate(parsed_pod, config, namespace=reviews.NAMESPACE)

    return {"floor": floor, "mutate": mutate, "validate": validate, "evaluate": evaluate}


def check_cases(cases: dict[str, Callable[[], Any]], containers: int) -> None:
    """Refuse to time a path that does not do what it is named for (a benchmark of a broken path is worthless)."""
    mutated = orjson.loads(cases["mutate"]())
    pinned = len(reviews.decode_patch(mutated))
    expected = containers if containers == 1 else containers - 1
    if not mutated["response"]["allowed"] or pinned != expected:
        raise RuntimeError(f"/mutate of the {containers}-container pod pinned {pinned} containers, expected {expected}")
    validated = orjson.loads(cases["validate"]())
    if not validated["response"]["allowed"]:
        raise RuntimeError(f"/validate denied the pinned {containers}-container pod: {validated['response']}")
    decision = cases["evaluate"]()
    if decision.validation.violations:
        raise RuntimeError(f"evaluate found violations in the typical pod: {decision.validation.violations}")


def time_path(function: Callable[[], Any], seconds: float) -> dict[str, float]:
    """Call ``function`` back to back for ``seconds``; per-call latency summary and calls per second.

    Each call is timed twice: wall clock (what a caller waits) and this thread's CPU time (what the code costs).
    On a shared machine the wall-clock tail includes the times the scheduler gave the pinned CPU to another
    process; the CPU-time tail does not, which tells the policy's own tail from its neighbours'.
    """
    samples: list[float] = []
    cpu: list[float] = []
    append, append_cpu = samples.append, cpu.append
    clock, cpu_clock = time.perf_counter, time.thread_time
    started = clock()
    deadline = started + seconds
    now = started
    while now < deadline:
        before, cpu_before = clock(), cpu_clock()
        function()
        cpu_after, now = cpu_clock(), clock()
        append(now - before)
        append_cpu(cpu_after - cpu_before)
    summary = latency_summary(samples)
    summary["cpu_p50_ms"] = percentile(cpu, 0.50) * 1e3
    summary["cpu_p99_ms"] = percentile(cpu, 0.99) * 1e3
    summary["reviews_per_s"] = len(samples) / (now - started)
    return summary


def run(sizes: Sequence[int], repeats: int, seconds: float, *, gc_freeze: bool = True) -> dict[str, Any]:
    cases = {size: build_cases(size) for size in sizes}
    for size, by_path in cases.items():
        check_cases(by_path, size)
        for function in by_path.values():  # warm up: first calls pay imports, caches and allocator growth
            for _ in range(50):
                function()
    runs: dict[tuple[int, str], list[dict[str, float]]] = {(s, p): [] for s in sizes for p in PATHS}
    if gc_freeze:
        gc.collect()
        gc.freeze()
    try:
        for _ in range(repeats):
            for size in sizes:
                for path in PATHS:
                    runs[(size, path)].append(time_path(cases[size][path], seconds))
    finally:
        if gc_freeze:
            gc.unfreeze()
    results = []
    for size in sizes:
        floor = median_of_runs(runs[(size, "floor")])
        for path in PATHS:
            figures = median_of_runs(runs[(size, path)])
            figures["throughput_vs_floor"] = figures["reviews_per_s"] / floor["reviews_per_s"]
            results.append({"containers": size, "path": path, "body_bytes": len(reviews.mutate_body(size)), **figures})
    return {
        "benchmark": "policy",
        "repeats": repeats,
        "seconds_per_run": seconds,
        "gc_freeze": gc_freeze,
        "results": results,
        "targets": targets(results),
    }


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DESIGN's in-process targets next to the measured medians."""
    judged = []
    by_key = {(row["containers"], row["path"]): row for row in results}
    if (1, "evaluate") in by_key:
        rate = by_key[(1, "evaluate")]["reviews_per_s"]
        judged.append(
            target(
                f"policy evaluation >= {TARGET_PODS_PER_SECOND} typical pods/s on one core",
                f"{rate:,.0f} pods/s (1-container pod)",
                rate >= TARGET_PODS_PER_SECOND,
            )
        )
    for path in ("mutate", "validate", "evaluate"):
        if (10, path) in by_key:
            p99 = by_key[(10, path)]["p99_ms"]
            what = "policy only" if path == "evaluate" else f"/{path}, full review"
            cpu_p99 = by_key[(10, path)]["cpu_p99_ms"]
            judged.append(
                target(
                    f"p99 <= {TARGET_P99_MS} ms for a 10-container pod ({what})",
                    f"{p99:.3f} ms (CPU time p99 {cpu_p99:.3f} ms)",
                    p99 <= TARGET_P99_MS,
                )
            )
    return judged


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| containers | path | reviews/s | p50 ms | p99 ms | CPU p99 ms | vs floor |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        lines.append(
            f"| {row['containers']} | {row['path']} | {row['reviews_per_s']:,.0f} | {row['p50_ms']:.3f} "
            f"| {row['p99_ms']:.3f} | {row['cpu_p99_ms']:.3f} | {row['throughput_vs_floor']:.2f} |"
        )
    lines += target_table(report["targets"])
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.policy_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default=",".join(map(str, reviews.CONTAINER_COUNTS)),
        help="containers per pod, comma-separated (default: 1,10,50)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="repeats; medians are reported (default: 5)")
    parser.add_argument("--seconds", type=float, default=0.4, help="seconds per path per repeat (default: 0.4)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU")
    parser.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="no gc.freeze() after the warm-up (serve's workers run with it)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: give whole numbers separated by commas, e.g. 1,10,50")
    if min(args.sizes) < 1 or args.repeats < 1 or args.seconds <= 0:
        parser.error("--sizes must be >= 1, --repeats >= 1 and --seconds > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    described = machine.describe()  # before pinning, so that it shows every CPU the machine offers
    cpu = None if args.no_pin else machine.pin_to_one_core()
    report = run(args.sizes, args.repeats, args.seconds, gc_freeze=args.gc_freeze)
    report["machine"] = {**described, "pinned_cpu": cpu}
    publish(report, markdown(report), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
