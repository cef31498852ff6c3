"""The auditor's cycle on a synthetic dense node at 1×, 2× and 4× DESIGN's size: time per phase, RSS, scaling.

DESIGN's dense node: 8 GPUs × 7 MIG slices, 110 pods × 4 containers, 2,000 GPU processes, 30,000 host processes.
``tests.fakes.node_scenario.dense_node`` builds it (fake NVML library, PodResources gRPC server on a unix socket,
host /proc tree with real device nodes, Kubernetes API fake); scale ``k`` multiplies every one of those sizes.

The fakes run in this process; the auditor runs in a child process (``--child``), so that its RSS and CPU are its
own, as on a node where the kubelet and the API server are other processes. The child drives the real
``auditor.daemon.Auditor`` through ``--cycles`` cycles, timing each phase by wrapping the adapters' methods:

``kubelet`` (PodResources ``List``), ``nvml`` (the NVML snapshot), ``proc_identity`` (the incremental /proc scan
and cgroup reads), ``visibility`` (what every container's processes show: their views' ``/dev``, their environments;
root files without a pod list),
``kube_cache`` (the pod cache's list/ensure), ``join`` (the rest of ``auditor.collect.collect``: assembling the
snapshot), ``audit`` (the pure audit), ``outputs`` (JSON report, metrics update and exposition, deduplicated Events
as ``run`` posts them).

Each cycle is timed on the wall clock and, beside it, in CPU time of the auditor process (``time.process_time``):
on a shared machine the wall clock counts the other processes' turns too, the CPU time much less so, and a
comparison of two versions is better read in it.

Warm cycles (second and later) are what a running DaemonSet pays; the first one reads every cgroup file once. Of the
warm cycles, the first ``startup_spread + recheck_scans`` (10) still re-read the host processes the first scan found
outside any pod, a share per cycle (``auditor.hostproc``); the cycles after them are *steady*, what a DaemonSet pays
from then on. Every scale's node is built first; then ``--rounds`` rounds start one auditor process per scale,
interleaved. Reported: median of the first cycles, of all warm cycles and of the steady ones, per phase; the slowest
warm cycle; the worst peak RSS; kubelet ``List`` calls per cycle counted by the client and by the fake kubelet, and
the ``GetAllocatableResources`` calls (at start, then every ``--allocatable-interval``); the Kubernetes API requests
per auditor process (the pod list, ResourceSlice discovery, list and watch); the log-log slope of warm cycle time
over scale (1.0 = linear). The child's auditor watches the ResourceSlices as ``run`` does.

The flooded-``/dev`` case (``--flooded-dev N``, 100,000 by default, 0: none) is the dense node once more with one
container whose ``/dev`` holds N more entries (character devices, so that no listing can skip them by type): what a
container that floods its ``/dev`` costs the cycle. It runs interleaved with the scales and is left out of the
scaling exponent.

The child measures the process the image runs: the packages of the test extra that a runtime dependency imports
when it finds them (``TEST_ONLY_MODULES``: the ``kubernetes`` package's dynamic client imports
``kubernetes_validate`` and with it ``jsonschema``, ~3 MB) are hidden from it, as the image does not install them;
``--with-test-extras`` keeps them.
``--layout shared`` builds the same counts without MIG: whole GPUs time-sliced among the pods, every GPU process
busy, so that NVML's per-process utilisation (which it does not report on MIG) is read every cycle, with a sample per
process. ``--baseline DIR`` runs, beside this tree's auditor and interleaved with it in every round, another version
installed in DIR (``pip install --no-deps --target DIR <checkout>``): a change measured before and after, side by side.

Run: ``python -m bench.auditor_bench`` (``--help``). Needs root (device nodes via mknod), like the tests.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench import machine
from bench.results import publish, target, target_table
from bench.stats import loglog_slope

ROOT = Path(__file__).resolve().parents[1]
BASE = {"gpus": 8, "pods": 110, "containers_per_pod": 4, "gpu_processes": 2000, "host_processes": 30_000}
PHASES = ("kubelet", "nvml", "proc_identity", "visibility", "kube_cache", "join", "audit", "outputs")
TARGET_CYCLE_MS = 250.0  # DESIGN: dense node (scale 1), warm cycle
TARGET_RSS_MB = 80.0
CHILD_TIMEOUT_S = 300
#: Modules of the test extra (pyproject ``[test]``) that runtime dependencies import only when installed: hidden from
#: the auditor child so that its RSS is that of the image, which installs the runtime dependencies only.
TEST_ONLY_MODULES = ("kubernetes_validate", "grpc_tools")
#: The node's layout: DESIGN's dense node (every GPU in MIG mode), or the same counts on whole time-sliced GPUs.
LAYOUTS = {"mig": 7, "shared": 0}
SHARED_ACTIVITY = (5, 2, 0, 0)  # percent per GPU process (SM, memory, encoder, decoder) on the shared layout


class BenchError(RuntimeError):
    """The benchmark could not run; the message says why."""


def default_node_dir() -> str | None:
    """A memory-backed directory when there is one: the host's /proc is in memory, and a tree of 120,000 process
    directories on disk would charge the auditor with dentry-cache misses that a real /proc never has."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def sizes(scale: int, fraction: float) -> dict[str, int]:
    """The dense node's sizes times ``scale`` (and ``fraction``, for tiny smoke runs).

    Counts scale; shapes do not: a GPU keeps 7 MIG slices and a pod keeps 4 containers, so 2× is twice the GPUs,
    pods, containers and processes of the dense node, not bigger pods.
    """
    scaled = {key: max(1, round(value * scale * fraction)) for key, value in BASE.items()}
    scaled["containers_per_pod"] = BASE["containers_per_pod"]
    return scaled


# --- child: the auditor, timed ---------------------------------------------------------------------------------


class PhaseClock:
    """Accumulates wall time per phase; ``wrap`` times every call of a bound method under one phase name. A call made
    inside another of the same phase (an adapter's method calling another wrapped one) is counted once, by the outer."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._running: set[str] = set()

    def wrap(self, owner: Any, method: str, phase: str) -> None:
        original = getattr(owner, method)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if phase in self._running:
                return original(*args, **kwargs)
            self._running.add(phase)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - started
                self._running.discard(phase)

        setattr(owner, method, timed)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)


def hide_test_only_modules() -> list[str]:
    """Make ``import`` of each test-only module fail, as in the image (``None`` in ``sys.modules`` raises
    ImportError, which the importing libraries expect); returns those hidden."""
    hidden = [name for name in TEST_ONLY_MODULES if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    return hidden


def child(
    auditor_args: Sequence[str], cycles: int, *, test_extras: bool = False, baseline: str | None = None
) -> dict[str, Any]:
    """Run ``cycles`` audit cycles with the real daemon code; per-cycle phase times, RSS and kubelet calls.

    ``baseline``: a directory with another installed gpu_fence, put first on the path (before this checkout, which
    ``-m`` puts there) so that this process audits with that version."""
    if baseline:
        sys.path.insert(0, baseline)
    hidden = [] if test_extras else hide_test_only_modules()
    # imported here, in the child only: the parent must not carry the auditor's libraries (nor its RSS)
    from gpu_fence.auditor import daemon
    from gpu_fence.auditor.cli import build_parser
    from gpu_fence.auditor.kube import EventRecorder
    from gpu_fence.auditor.metrics import AuditorMetrics
    from gpu_fence.auditor.report import render
    from gpu_fence.auditor.settings import AuditSettings

    args = build_parser().parse_args(list(auditor_args))
    auditor = daemon.Auditor(AuditSettings.from_args(args), watch=True)
    auditor.preflight()
    clock = PhaseClock()
    sources = auditor.sources()
    clock.wrap(sources.podresources, "list", "kubelet")
    clock.wrap(sources.nvml, "snapshot", "nvml")
    clock.wrap(sources.hostproc, "scan", "proc_identity")
    clock.wrap(sources.hostproc, "identity", "proc_identity")
    clock.wrap(sources.hostproc, "exists", "proc_identity")
    clock.wrap(sources.hostproc, "inspect", "visibility")
    clock.wrap(sources.hostproc, "environ", "visibility")
    clock.wrap(sources.hostproc, "read_root_file", "visibility")
    if sources.pods is not None:
        clock.wrap(sources.pods, "ensure", "kube_cache")
    # The whole of collect, then less the sources' own phases below: what is left is the join.
    clock.wrap(daemon, "collect", "join")
    clock.wrap(daemon, "audit", "audit")
    metrics = AuditorMetrics(auditor.node, args.pod_label)
    events = EventRecorder(auditor.api_client, auditor.node) if auditor.api_client is not None else None
    rss_before_cycles = machine.rss_bytes()  # every library imported and every adapter open: the fixed cost
    rows = []
    try:
        for _ in range(cycles):
            clock.reset()
            calls_before = sources.podresources.calls["List"]
            offers_before = sources.podresources.calls["GetAllocatableResources"]
            started, cpu_started = time.perf_counter(), time.process_time()
            snapshot, result = auditor.cycle()
            cycle_seconds = time.perf_counter() - started
            outputs_started = time.perf_counter()
            render("json", snapshot, result)
            metrics.observe(snapshot, result, cycle_seconds)
            metrics.sync_kubelet_calls(sources.podresources.calls)
            metrics.exposition()
            if events is not None:
                events.record(result.findings)
            outputs = time.perf_counter() - outputs_started
            cpu = time.process_time() - cpu_started
            phases = dict(clock.seconds)
            phases["join"] -= sum(
                phases[name] for name in ("kubelet", "nvml", "proc_identity", "visibility", "kube_cache")
            )
            phases["outputs"] = outputs
            rows.append(
                {
                    "cycle_ms": (cycle_seconds + outputs) * 1e3,
                    "cpu_ms": cpu * 1e3,
                    "phases_ms": {name: value * 1e3 for name, value in phases.items()},
                    "kubelet_calls": sources.podresources.calls["List"] - calls_before,
                    "allocatable_calls": sources.podresources.calls["GetAllocatableResources"] - offers_before,
                    "containers": len(result.rows),
                    "findings": len(result.findings),
                    "gpu_processes": len(snapshot.processes),
                    "identity": snapshot.identity_source.value,
                    "rss_bytes": machine.rss_bytes(),
                    "peak_rss_bytes": machine.peak_rss_bytes(),
                }
            )
            del snapshot, result  # as run does: the next cycle does not build beside this one
    finally:
        auditor.close()
    hostproc = sources.hostproc
    return {
        "auditor_module": daemon.__file__,
        "cycles": rows,
        "rss_before_cycles_bytes": rss_before_cycles,
        "rss_bytes": machine.rss_bytes(),
        "peak_rss_bytes": machine.peak_rss_bytes(),
        "hidden_modules": hidden,
        "settling_cycles": hostproc.startup_spread + hostproc.recheck_scans,
    }


# --- parent: the node, and the child per scale ------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One node the benchmark audits: the dense node at ``scale``, with ``flooded_dev`` more entries in one ``/dev``."""

    scale: int
    flooded_dev: int = 0

    @property
    def name(self) -> str:
        return f"{self.scale}x" + (f" + flooded /dev ({self.flooded_dev:,})" if self.flooded_dev else "")


def build_node(case: Case, fraction: float, workdir: Path, layout: str = "mig") -> tuple[Any, dict[str, int], float]:
    """The case's node, started: (scenario, sizes, seconds it took to build)."""
    from tests.fakes.node_scenario import dense_node

    size = sizes(case.scale, fraction)
    built = time.perf_counter()
    name = f"node-{case.scale}x" + ("-flooded" if case.flooded_dev else "")
    slots = LAYOUTS[layout]
    activity = SHARED_ACTIVITY if not slots else None
    scenario = dense_node(workdir / name, slots=slots, activity=activity, flooded_dev=case.flooded_dev, **size)
    scenario.start()
    return scenario, size, time.perf_counter() - built


def run_child(
    scenario: Any, scale: int, cycles: int, *, test_extras: bool = False, baseline: str | None = None
) -> dict[str, Any]:
    """One auditor process on ``scenario`` for ``cycles`` cycles (the first cold); what the child reported.

    ``baseline``: a directory holding another installed gpu_fence, put first on the child's path so that it runs
    that version's auditor (this tree's benchmark code drives it)."""
    requests_before = len(scenario.api.requests) if scenario.api is not None else 0
    command = [
        sys.executable,
        "-m",
        "bench.auditor_bench",
        "--child",
        "--cycles",
        str(cycles),
        *(["--with-test-extras"] if test_extras else []),
        *(["--baseline", baseline] if baseline else []),
        "--",
        *scenario.args("once"),
    ]
    env = scenario.env({**os.environ, "PYTHONPATH": str(ROOT)})
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=ROOT, env=env, check=False
    )
    if result.returncode != 0:
        which = f" (baseline {baseline})" if baseline else ""
        raise BenchError(f"the auditor child failed at scale {scale}{which}: {result.stderr.strip()[-2000:]}")
    report = orjson.loads(result.stdout.strip().splitlines()[-1])
    report["api_requests"] = (len(scenario.api.requests) if scenario.api is not None else 0) - requests_before
    return report


def summarise(
    case: Case,
    size: dict[str, int],
    runs: list[dict[str, Any]],
    served_calls: int,
    build_seconds: float,
    *,
    layout: str = "mig",
) -> dict[str, Any]:
    """One case's figures over every child run: medians of the cold cycles and of all warm cycles; worst RSS."""
    scale = case.scale
    firsts = [run["cycles"][0] for run in runs]
    warm = [cycle for run in runs for cycle in run["cycles"][1:]] or firsts
    steady = [cycle for run in runs for cycle in run["cycles"][1 + run["settling_cycles"] :]]
    cycles = [cycle for run in runs for cycle in run["cycles"]]
    last = runs[-1]["cycles"][-1]
    return {
        "scale": scale,
        "case": case.name,
        "flooded_dev": case.flooded_dev,
        "sizes": {
            **size,
            "mig_slices": size["gpus"] * LAYOUTS[layout],
            "containers": size["pods"] * size["containers_per_pod"],
        },
        "first_cycle_ms": statistics.median(c["cycle_ms"] for c in firsts),
        "first_phases_ms": {name: statistics.median(c["phases_ms"][name] for c in firsts) for name in PHASES},
        "warm_cycle_ms": statistics.median(c["cycle_ms"] for c in warm),
        "warm_cycle_min_ms": min(c["cycle_ms"] for c in warm),
        "warm_cycle_max_ms": max(c["cycle_ms"] for c in warm),
        "warm_phases_ms": {name: statistics.median(c["phases_ms"][name] for c in warm) for name in PHASES},
        "warm_cycles": len(warm),
        "settling_cycles": runs[0]["settling_cycles"],
        "steady_cycle_ms": statistics.median(c["cycle_ms"] for c in steady) if steady else None,
        "warm_cpu_ms": statistics.median(c["cpu_ms"] for c in warm),
        "steady_cpu_ms": statistics.median(c["cpu_ms"] for c in steady) if steady else None,
        "steady_phases_ms": (
            {name: statistics.median(c["phases_ms"][name] for c in steady) for name in PHASES} if steady else None
        ),
        "steady_cycles": len(steady),
        "hidden_modules": runs[0]["hidden_modules"],
        "auditor_module": runs[0]["auditor_module"],
        "auditor_processes": len(runs),
        "kubelet_calls_per_cycle": max(c["kubelet_calls"] for c in cycles),
        "kubelet_calls_served": served_calls,
        "allocatable_calls_per_process": max(sum(c["allocatable_calls"] for c in run["cycles"]) for run in runs),
        "allocatable_calls_warm": sum(c["allocatable_calls"] for run in runs for c in run["cycles"][1:]),
        "api_requests_per_process": statistics.median(run["api_requests"] for run in runs),
        "cycles_run": len(cycles),
        "containers_audited": last["containers"],
        "findings": last["findings"],
        "gpu_processes_seen": last["gpu_processes"],
        "identity": last["identity"],
        "rss_before_cycles_mb": statistics.median(run["rss_before_cycles_bytes"] for run in runs) / 1e6,
        "peak_rss_mb": max(run["peak_rss_bytes"] for run in runs) / 1e6,
        "peak_rss_after_first_cycle_mb": max(c["peak_rss_bytes"] for c in firsts) / 1e6,
        "warm_rss_mb": statistics.median(c["rss_bytes"] for c in warm) / 1e6,
        "node_build_s": build_seconds,
    }


def run(
    scales: Sequence[int],
    fraction: float,
    cycles: int,
    rounds: int,
    workdir: Path,
    *,
    test_extras: bool = False,
    flooded_dev: int = 0,
    layout: str = "mig",
    baseline: str | None = None,
) -> dict[str, Any]:
    """Build every case's node (each scale, and the flooded ``/dev`` one), then run ``rounds`` rounds of one auditor
    process per case (and per version, with a ``baseline``), interleaved, so that a busy spell of a shared machine
    lands on every case and version rather than on one."""
    cases = [Case(scale) for scale in scales] + ([Case(1, flooded_dev)] if flooded_dev else [])
    nodes: dict[Case, tuple[Any, dict[str, int], float]] = {}
    versions = [None, baseline] if baseline else [None]
    try:
        for case in cases:
            nodes[case] = build_node(case, fraction, workdir, layout)
        runs: dict[tuple[Case, str | None], list[dict[str, Any]]] = {(c, v): [] for c in cases for v in versions}
        served: dict[tuple[Case, str | None], int] = dict.fromkeys(runs, 0)  # List calls the fake kubelet answered
        for _ in range(rounds):
            for case in cases:
                for version in versions:
                    kubelet = nodes[case][0].kubelet
                    before = kubelet.calls["List"]
                    runs[(case, version)].append(
                        run_child(nodes[case][0], case.scale, cycles, test_extras=test_extras, baseline=version)
                    )
                    served[(case, version)] += kubelet.calls["List"] - before
        summaries: dict[str | None, list[dict[str, Any]]] = {version: [] for version in versions}
        for case in cases:
            _, size, build_seconds = nodes[case]
            for version in versions:
                key = (case, version)
                summaries[version].append(summarise(case, size, runs[key], served[key], build_seconds, layout=layout))
    finally:
        for scenario, _, _ in nodes.values():
            scenario.stop()
    report: dict[str, Any] = {
        "benchmark": "auditor",
        "layout": layout,
        "fraction": fraction,
        "cycles_per_process": cycles,
        "rounds": rounds,
        "test_extras": test_extras,
        "flooded_dev": flooded_dev,
        "results": summaries[None],
    }
    if baseline:
        report["baseline"] = {"site": baseline, "results": summaries[baseline]}
    results = report["results"]
    plain = [r for r in results if not r["flooded_dev"]]
    if len(plain) >= 2:
        report["scaling_exponent"] = loglog_slope(scales, [r["warm_cycle_ms"] for r in plain])
        report["phase_scaling_exponents"] = {
            name: loglog_slope(scales, [max(r["warm_phases_ms"][name], 1e-3) for r in plain]) for name in PHASES
        }
    report["targets"] = targets(report)
    return report


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    judged = []
    dense = next((r for r in report["results"] if r["scale"] == 1 and not r["flooded_dev"]), None)
    if dense is not None and report["fraction"] == 1.0:
        steady = f", steady {dense['steady_cycle_ms']:.0f} ms" if dense["steady_cycle_ms"] is not None else ""
        judged.append(
            target(
                f"warm cycle <= {TARGET_CYCLE_MS:.0f} ms on the dense node",
                f"{dense['warm_cycle_ms']:.0f} ms median, {dense['warm_cycle_max_ms']:.0f} ms slowest{steady}",
                dense["warm_cycle_ms"] <= TARGET_CYCLE_MS,
            )
        )
        judged.append(
            target(
                f"RSS <= {TARGET_RSS_MB:.0f} MB on the dense node",
                f"{dense['peak_rss_mb']:.0f} MB peak",
                dense["peak_rss_mb"] <= TARGET_RSS_MB,
            )
        )
    calls = ", ".join(
        f"{r['kubelet_calls_per_cycle']} List, {r['allocatable_calls_per_process']} GetAllocatableResources "
        f"per process at {r['case']}"
        for r in report["results"]
    )
    one_list = all(
        r["kubelet_calls_per_cycle"] == 1
        and r["kubelet_calls_served"] == r["cycles_run"]
        and r["allocatable_calls_per_process"] == 1
        and r["allocatable_calls_warm"] == 0
        for r in report["results"]
    )
    judged.append(
        target("one kubelet List per cycle (GetAllocatableResources at start only, at this length)", calls, one_list)
    )
    if "scaling_exponent" in report:
        slope = report["scaling_exponent"]
        judged.append(target("linear in the input (log-log slope ~1, <= 1.15)", f"{slope:.2f}", slope <= 1.15))
    return judged


def phase_table(results: list[dict[str, Any]]) -> list[str]:
    """Per node, the first, warm and steady cycles with their phases."""
    header = "| node | cycle | total ms | " + " | ".join(PHASES) + " |"
    lines = [header, "|---|---|---:|" + "---:|" * len(PHASES)]
    for row in results:
        shown = [
            ("first", row["first_cycle_ms"], row["first_phases_ms"]),
            ("warm (median)", row["warm_cycle_ms"], row["warm_phases_ms"]),
        ]
        if row["steady_cycle_ms"] is not None:
            shown.append((f"steady (after {row['settling_cycles']})", row["steady_cycle_ms"], row["steady_phases_ms"]))
        for label, total, phases in shown:
            cells = " | ".join(f"{phases[name]:.1f}" for name in PHASES)
            lines.append(f"| {row['case']} | {label} | {total:.1f} | {cells} |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    lines = phase_table(report["results"])
    lines += [
        "",
        "| node | containers | GPU processes | host processes | slowest warm ms | warm CPU ms | steady CPU ms "
        "| RSS before cycles MB | peak RSS MB | kubelet List/cycle | API requests/process |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["results"]:
        lines.append(
            f"| {row['case']} | {row['containers_audited']} | {row['gpu_processes_seen']} | "
            f"{row['sizes']['host_processes']} | {row['warm_cycle_max_ms']:.0f} | {row['warm_cpu_ms']:.0f} | "
            f"{'-' if row['steady_cpu_ms'] is None else format(row['steady_cpu_ms'], '.0f')} | "
            f"{row['rss_before_cycles_mb']:.0f} | {row['peak_rss_mb']:.0f} | "
            f"{row['kubelet_calls_per_cycle']} | {row['api_requests_per_process']:g} |"
        )
    hidden = report["results"][0]["hidden_modules"] if report["results"] else []
    lines += [
        "",
        "test-only modules hidden from the auditor (as in the image): "
        f"{', '.join(hidden) if hidden else 'none (--with-test-extras)'}",
    ]
    if "scaling_exponent" in report:
        phases = ", ".join(f"{name} {value:.2f}" for name, value in report["phase_scaling_exponents"].items())
        lines += ["", f"scaling exponent (warm cycle): {report['scaling_exponent']:.2f}; per phase: {phases}"]
    lines += ["", f"layout: {report.get('layout', 'mig')}"]
    if "baseline" in report:
        lines += ["", *side_by_side(report)]
    lines += target_table(report["targets"])
    return "\n".join(lines) + "\n"


def side_by_side(report: dict[str, Any]) -> list[str]:
    """This tree against the baseline, per node: medians of the same rounds, and their ratio."""
    lines = [
        f"baseline: {report['baseline']['site']} (run interleaved with this tree, same node, same rounds)",
        "",
        "| node | cycle | baseline ms | this tree ms | ratio | nvml baseline | nvml this tree | peak RSS MB (baseline"
        " / this tree) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for mine, theirs in zip(report["results"], report["baseline"]["results"], strict=True):
        shown = [("warm (median)", "warm_cycle_ms", "warm_phases_ms")]
        if mine["steady_cycle_ms"] is not None and theirs["steady_cycle_ms"] is not None:
            shown.append((f"steady (after {mine['settling_cycles']})", "steady_cycle_ms", "steady_phases_ms"))
        for label, total, phases in shown:
            lines.append(
                f"| {mine['case']} | {label} | {theirs[total]:.1f} | {mine[total]:.1f} | "
                f"{mine[total] / theirs[total]:.2f} | {theirs[phases]['nvml']:.1f} | {mine[phases]['nvml']:.1f} | "
                f"{theirs['peak_rss_mb']:.1f} / {mine['peak_rss_mb']:.1f} |"
            )
    lines += ["", "the baseline's phases:", "", *phase_table(report["baseline"]["results"])]
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.auditor_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="1,2,4", help="multiples of the dense node (default: 1,2,4)")
    parser.add_argument(
        "--cycles",
        type=int,
        default=14,
        help="cycles per auditor process; the first is cold, the next 10 settle (default: 14)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="auditor processes per scale, started in interleaved rounds (default: 3)"
    )
    parser.add_argument(
        "--fraction",
        type=float,
        default=1.0,
        help="shrink every size by this factor (smoke runs; targets are judged only at 1.0)",
    )
    parser.add_argument(
        "--flooded-dev",
        type=int,
        default=100_000,
        metavar="N",
        help="also audit the 1x node with N more entries in one container's /dev (default: 100000; 0: not)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument(
        "--node-dir",
        metavar="DIR",
        default=default_node_dir(),
        help="where to build the fake node (default: /dev/shm when writable, else the temp dir)",
    )
    parser.add_argument(
        "--with-test-extras",
        dest="test_extras",
        action="store_true",
        help="let the auditor import the test extra's packages (default: hidden, as in the image)",
    )
    parser.add_argument(
        "--layout",
        choices=sorted(LAYOUTS),
        default="mig",
        help="mig: DESIGN's dense node, every GPU in MIG mode; shared: the same counts on whole time-sliced GPUs, "
        "every GPU process busy (NVML samples per-process utilisation there, not on MIG) (default: mig)",
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also run, interleaved, the gpu_fence installed in DIR (pip install --no-deps --target DIR <checkout>)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    args.auditor_args = [arg for arg in rest if arg != "--"]
    if args.child:
        return args
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        args.scales = [int(scale) for scale in args.scales.split(",")]
    except ValueError:
        parser.error(f"--scales {args.scales!r}: give whole numbers separated by commas, e.g. 1,2,4")
    if min(args.scales) < 1 or args.cycles < 2 or args.rounds < 1 or not 0 < args.fraction <= 1:
        parser.error("--scales and --rounds must be >= 1, --cycles >= 2 (one cold, the rest warm), 0 < --fraction <= 1")
    if args.flooded_dev < 0:
        parser.error("--flooded-dev must be 0 or more")
    if args.baseline is not None:
        args.baseline = os.path.abspath(args.baseline)
        if not os.path.isfile(os.path.join(args.baseline, "gpu_fence", "auditor", "daemon.py")):
            parser.error(
                f"--baseline {args.baseline}: no installed gpu_fence there (make it with pip install "
                "--no-deps --target DIR <checkout>)"
            )
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        sys.stdout.write(
            orjson.dumps(
                child(args.auditor_args, args.cycles, test_extras=args.test_extras, baseline=args.baseline)
            ).decode()
            + "\n"
        )
        return 0
    if os.geteuid() != 0:
        print("auditor_bench: needs root to make the fake node's device nodes (mknod)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))  # tests.fakes: the scenario builder lives with the tests
    with tempfile.TemporaryDirectory(prefix="gpu-fence-bench-", dir=args.node_dir) as directory:
        try:
            report = run(
                args.scales,
                args.fraction,
                args.cycles,
                args.rounds,
                Path(directory),
                test_extras=args.test_extras,
                flooded_dev=args.flooded_dev,
                layout=args.layout,
                baseline=args.baseline,
            )
        except BenchError as error:
            print(f"auditor_bench: {error}", file=sys.stderr)
            return 2
    report["machine"] = machine.describe()
    report["node_dir"] = args.node_dir or tempfile.gettempdir()
    publish(report, markdown(report), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
