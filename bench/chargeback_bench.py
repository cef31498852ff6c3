"""The chargeback bill of a GPU fleet against a real Prometheus: time, peak RSS, series and samples, by fleet size.

For each configuration (GPUs, days, resolution) the benchmark builds the synthetic fleet of
``bench/chargeback_fleet.py`` (H100 nodes, exclusive, time-sliced and MIG; 16,000 pods a day at 2,048 GPUs), writes
what the chargeback recording rules record over it (``bench/chargeback_recorded.py``, checked against the real
rules by ``tests/bench/test_bench_chargeback.py``), backfills both into a fresh Prometheus with ``promtool tsdb
create-blocks-from openmetrics`` (one 2-hour block at a time), starts it, and runs ``gpu-fence-auditor
chargeback --format json`` as a child process, ``--repeats`` times per path:

- ``recorded``: ``--series recorded``, the rules' series summed in Prometheus;
- ``raw``: ``--series raw --step RESOLUTION``, the auditor's raw series split by the command, chunk by chunk;
- ``baseline``: ``--baseline COMMAND`` (another installation's ``gpu-fence-auditor``, e.g. the one before these
  changes) with the raw series' arguments it understands;
- ``before-recorded``, ``before-raw``: ``--before COMMAND`` (another installation of a version with both paths,
  e.g. the one before a change to either) with the same arguments as ``recorded`` and ``raw``, bill for bill
  beside them.

Both paths bill the same instants (the rules are written at phase 0, the range starts on the grid), so the bench
also checks that they bill the same total. Reported per bill: wall time and the child's peak RSS (``wait4``), and
Prometheus' CPU seconds and peak RSS over the bill (``/proc``; the peak is reset before each bill). Per
configuration: pods, series and samples (raw and recorded), the recorded series live at one evaluation per GPU
and per container, and the set-up times. Across sizes at one resolution: the growth of the bill's time and the
log-log slope of time over devices × intervals (1.0 = linear).

Run: ``python -m bench.chargeback_bench`` (``--help``). Needs Debian's ``prometheus`` and ``promtool``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import machine
from bench.chargeback_fleet import BLOCK, PRICES_YAML, Fleet, Key, Series, build
from bench.chargeback_recorded import evaluation_grid, hourly, record
from bench.results import publish, target, target_table
from bench.stats import loglog_slope
from gpu_fence.chargeback import rules
from gpu_fence.chargeback.bill import Charge

ROOT = Path(__file__).resolve().parents[1]
COMMAND = Path(sys.executable).with_name("gpu-fence-auditor")
PATHS = ("recorded", "raw")
TARGET = {"gpus": 2048, "days": 30, "resolution": 300, "seconds": 60.0, "rss_mb": 1024.0}  # issues 16 and 25
TARGETS = (
    {**TARGET, "what": "a 30-day bill of 2,048 GPUs at 5 minutes"},
    {"gpus": 2048, "days": 1, "resolution": 60, "seconds": 40.0, "rss_mb": 800.0, "what": "a day at 1 minute"},
)
BILL_TIMEOUT = 3600


class BenchError(RuntimeError):
    """The benchmark could not run; the message says why."""


@dataclass(frozen=True)
class Config:
    gpus: int
    days: float
    resolution: float  # seconds between samples, and between the rules' evaluations

    @property
    def label(self) -> str:
        return f"{self.gpus} GPUs, {self.days:g} d, {self.resolution:g} s"


def start_of_range(days: float) -> int:
    """A range that ends two whole blocks before the current one (backfilled blocks must be older than the head)
    and starts on a day boundary minus ``days``."""
    end = int(time.time()) // BLOCK * BLOCK - 2 * BLOCK
    return int(end - days * 86400)


@dataclass(frozen=True)
class Setup:
    """How a configuration's Prometheus is filled."""

    # "written": the benchmark writes what the rules record (bench/chargeback_recorded.py: the split and its hourly
    # sums); "promtool": promtool's backfill evaluates the product's own rules (``chargeback --rules`` at the
    # resolution) against the raw series, the split first and its hourly sums after: slow, and exact
    rules: str = "written"
    # only what a recorded bill reads: no raw series, and of the per-container series only overreach's (a month
    # of every series is more text than this machine writes in an afternoon); raw bills cannot be made then
    lean: bool = False
    block_hours: int = 2  # hours per TSDB block (Prometheus compacts a month's blocks to days)

    @property
    def block(self) -> int:
        return self.block_hours * 3600


def read_by_a_bill(key: Key) -> bool:
    """Whether a recorded bill reads this recorded series: all but the per-container ones, which it reads for
    overreach only (``Setup.lean``)."""
    metric, labels = key
    return not metric.startswith("gpu_container:") or dict(labels).get("charge") == Charge.OVERREACH.value


def backfill(fleet: Fleet, others: Sequence[Series], data: Path, setup: Setup = Setup()) -> dict[str, float]:
    """Write the fleet's series (unless ``setup.lean``) and ``others`` into TSDB blocks in ``data``: text for one
    block while promtool turns the previous one into a block. Returns the seconds spent writing text and waiting
    for promtool."""
    data.mkdir(parents=True, exist_ok=True)
    spent = {"text_s": 0.0, "promtool_s": 0.0}
    pending: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    blocks = fleet.blocks(*others, raw=not setup.lean, size=setup.block)
    for index in itertools.count():
        begun = time.monotonic()
        item = next(blocks, None)
        spent["text_s"] += time.monotonic() - begun
        if pending:
            waited = time.monotonic()
            _finish(pending.pop())
            spent["promtool_s"] += time.monotonic() - waited
        if item is None:
            break
        path = data.parent / f"block-{index % 2}.om"
        path.write_text(item[1], encoding="utf-8")
        promtool = shutil.which("promtool")
        if promtool is None:
            raise BenchError("promtool is not installed (apt-get install prometheus)")
        pending.append(
            subprocess.Popen(
                [
                    promtool,
                    "tsdb",
                    "create-blocks-from",
                    "openmetrics",
                    "--quiet",
                    f"--max-block-duration={setup.block_hours}h",
                    str(path),
                    str(data),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
    spent["total_s"] = time.monotonic() - started
    for name in ("block-0.om", "block-1.om"):
        (data.parent / name).unlink(missing_ok=True)
    return spent


def _finish(process: subprocess.Popen[bytes]) -> None:
    _out, error = process.communicate(timeout=3600)
    if process.returncode != 0:
        raise BenchError(f"promtool backfill failed: {error.decode(errors='replace').strip()[-500:]}")


def live_cardinality(series: Series, fleet: Fleet, at: float) -> dict[str, float]:
    """Recorded series live at one evaluation (``at``), in all, per GPU and per container holding one."""
    live: dict[str, int] = {}
    for (metric, _labels), runs in series.runs.items():
        if any(run.start <= at <= run.end for run in runs):
            live[metric] = live.get(metric, 0) + 1
    containers = sum(
        1
        for (metric, _labels), runs in fleet.series.runs.items()
        if metric == "gpu_fence_container_allocated_gpus" and any(run.start <= at <= run.end for run in runs)
    )
    per_container = sum(count for metric, count in live.items() if metric.startswith("gpu_container:"))
    per_gpu = sum(count for metric, count in live.items() if not metric.startswith("gpu_container:"))
    return {
        "by_metric": live,
        "containers": containers,
        "per_gpu": per_gpu / fleet.gpus,
        "per_container": per_container / max(1, containers),
    }


def run_bill(command: Sequence[str], server_pid: int) -> dict[str, Any]:
    """One bill as a child process: wall time, its peak RSS, and Prometheus' CPU and peak RSS while it ran.

    The child's peak is its own ``VmHWM``, read every ``PEAK_POLL`` seconds until it exits: the ``ru_maxrss``
    that ``wait4`` reports folds in the benchmark's own pages from before ``exec`` (Linux keeps the maximum
    across it), which here hold the whole fleet."""
    _reset_peak(server_pid)
    cpu_before = _cpu_seconds(server_pid)
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        started = time.monotonic()
        process = subprocess.Popen(
            [*command, "--output", output.name], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        peak = _Peak(process.pid)
        peak.start()
        _out, stderr = process.communicate(timeout=BILL_TIMEOUT)
        seconds = time.monotonic() - started
        peak.join()
        if process.returncode != 0:
            raise BenchError(f"the bill failed ({process.returncode}): {stderr.decode(errors='replace')[-500:]}")
        document = json.loads(Path(output.name).read_text(encoding="utf-8"))
    return {
        "seconds": seconds,
        "peak_rss_mb": peak.bytes / 2**20,
        "prometheus_cpu_s": _cpu_seconds(server_pid) - cpu_before,
        "prometheus_peak_rss_mb": machine.peak_rss_bytes(server_pid) / 2**20,
        "total_gpu_cost": document["total_gpu_cost"],
        "series": document["range"].get("series", "raw"),
        "hourly_sums": document["range"].get("hourly_sums", 0),
    }


PEAK_POLL = 0.02


class _Peak(threading.Thread):
    """The highest VmHWM a process reported while it ran."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.bytes = pid, 0

    def run(self) -> None:
        while Path(f"/proc/{self.pid}").exists():
            self.bytes = max(self.bytes, machine.peak_rss_bytes(self.pid))
            time.sleep(PEAK_POLL)  # a poll interval


def _reset_peak(pid: int) -> None:
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5", encoding="ascii")  # VmHWM back to the current RSS


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@dataclass(frozen=True)
class Bill:
    """What every bill of a configuration asks."""

    url: str
    start: float
    end: float
    prices: Path
    baseline: str | None
    before: str | None = None


def commands(config: Config, bill: Bill) -> Iterator[tuple[str, list[str]]]:
    common = ["--prometheus", bill.url, "--start", f"{bill.start:.0f}", "--end", f"{bill.end:.0f}"]
    common += ["--prices", str(bill.prices), "--format", "json", "--timeout", "900"]
    step = ["--step", f"{config.resolution:g}"]
    for name, command in (("", str(COMMAND)), ("before-", bill.before)):
        if command:
            yield f"{name}recorded", [command, "chargeback", *common, "--series", "recorded", "--quiet"]
            yield f"{name}raw", [command, "chargeback", *common, "--series", "raw", *step, "--quiet"]
    if bill.baseline:
        yield "baseline", [bill.baseline, "chargeback", *common, *step]


def run_config(  # noqa: PLR0917
    config: Config,
    paths: Sequence[str],
    repeats: int,
    workdir: Path,
    baseline: str | None,
    before: str | None = None,
    setup: Setup = Setup(),
) -> dict:
    from tests.fakes.prometheus import PrometheusServer  # the fake lives with the tests (main puts them on the path)

    result: dict[str, Any] = {"gpus": config.gpus, "days": config.days, "resolution_s": config.resolution}
    result["setup"] = {"rules": setup.rules, "lean": setup.lean, "block_hours": setup.block_hours}
    start = start_of_range(config.days)
    end = start + config.days * 86400
    began = time.monotonic()
    fleet = build(config.gpus, start, end, config.resolution)
    result["build_s"] = time.monotonic() - began
    result["pods"] = fleet.pods
    result["intervals"] = round(config.days * 86400 / config.resolution)
    result["raw_series"], result["raw_samples"] = fleet.series.count(), fleet.series.samples(fleet.grid)
    others: list[Series] = []
    if "recorded" in paths and setup.rules == "written":
        began = time.monotonic()
        keep = read_by_a_bill if setup.lean else None
        recorded = record(fleet, config.resolution, workers=os.cpu_count() or 1, keep=keep)
        # The recorded series are written on the fleet's grid (the bills' instants), so their hours are summed there.
        sums = hourly(recorded, fleet.grid)
        result["record_s"] = time.monotonic() - began
        result["recorded_series"], result["recorded_samples"] = recorded.count(), recorded.samples(fleet.grid)
        result["hourly_series"] = sums.count()
        result["hourly_samples"] = sums.samples(sums.grid) if sums.grid else 0
        if not setup.lean:  # the per-container series are not there to count
            last = evaluation_grid(fleet, config.resolution).last(end)
            result["cardinality"] = live_cardinality(recorded, fleet, last)
        others = [recorded, sums]
        del recorded
    first = fleet.grid.origin
    result["backfill"] = backfill(fleet, others, workdir / "data", setup)
    del fleet, others
    prices = workdir / "prices.yaml"
    prices.write_text(PRICES_YAML, encoding="utf-8")
    # No compaction while bills run: the backfilled blocks stay as they are. Prometheus' own query timeout is
    # raised so that a slow bill (the version before a change) finishes: --timeout is the bill's own limit.
    flags = [f"--storage.tsdb.max-block-duration={setup.block_hours}h", "--query.timeout=15m"]
    server = PrometheusServer(workdir, retention=f"{int(config.days) + 10}d", flags=flags)
    with server:
        if "recorded" in paths and setup.rules == "promtool":
            began = time.monotonic()
            for level in rule_levels(config.resolution):
                server.record(level, [(int(first), int(end))], timeout=6 * 3600)
            result["record_s"] = time.monotonic() - began
        result["tsdb_mb"] = sum(path.stat().st_size for path in workdir.rglob("*") if path.is_file()) / 2**20
        bills: dict[str, list[dict]] = {}
        for _repeat in range(repeats):
            for path, command in commands(config, Bill(server.url, start, end, prices, baseline, before)):
                if path.removeprefix("before-") in paths or path == "baseline":
                    bills.setdefault(path, []).append(run_bill(command, server.process.pid))
    result["bills"] = {path: _median(runs) for path, runs in bills.items()}
    totals = {round(runs[0]["total_gpu_cost"], 2) for runs in bills.values()}
    result["same_total"] = len(totals) == 1
    return result


def rule_levels(interval: float) -> list[str]:
    """The product's chargeback rules at ``interval`` as one rules file per group, in the order promtool must
    backfill them (the hourly sums read what the split recorded: Prometheus' docs/storage.md, "Backfilling for
    Recording Rules", Limitations)."""
    groups = yaml.safe_load(rules.rules_file(interval))["groups"]
    return [yaml.safe_dump({"groups": [group]}, sort_keys=False) for group in groups]


def _median(runs: list[dict]) -> dict[str, Any]:
    summary = {key: statistics.median(run[key] for run in runs) for key in runs[0] if isinstance(runs[0][key], float)}
    return {
        **summary,
        "repeats": len(runs),
        "series": runs[0]["series"],
        "hourly_sums": runs[0]["hourly_sums"],
        "all_seconds": [run["seconds"] for run in runs],
    }


def growth(results: list[dict]) -> list[dict]:
    """Per resolution, days and path: how time and memory grew from one size to the next, and the log-log slope of
    the bill's time over devices × intervals."""
    rows = []
    keyed: dict[tuple, list[dict]] = {}
    for result in results:
        for path, bill in result["bills"].items():
            keyed.setdefault((result["resolution_s"], result["days"], path), []).append({**bill, **result})
    for (resolution, days, path), items in sorted(keyed.items()):
        items.sort(key=lambda item: item["gpus"])
        if len(items) < 2:
            continue
        work = [item["gpus"] * item["intervals"] for item in items]
        rows.append(
            {
                "resolution_s": resolution,
                "days": days,
                "path": path,
                "sizes": [item["gpus"] for item in items],
                "time_ratios": [b["seconds"] / a["seconds"] for a, b in itertools.pairwise(items)],
                "rss_ratios": [b["peak_rss_mb"] / a["peak_rss_mb"] for a, b in itertools.pairwise(items)],
                "slope": loglog_slope(work, [item["seconds"] for item in items]),
            }
        )
    return rows


def targets(results: list[dict]) -> list[dict]:
    """The issue's targets that this run measured: a month of 2,048 GPUs at 5 minutes, a day at 1 minute."""
    found = []
    for goal in TARGETS:
        for result in results:
            shape = (result["gpus"], result["days"], result["resolution_s"])
            if shape == (goal["gpus"], goal["days"], goal["resolution"]) and "recorded" in result["bills"]:
                bill = result["bills"]["recorded"]
                found += [
                    target(
                        f"{goal['what']} in <= {goal['seconds']:g} s",
                        f"{bill['seconds']:.1f} s",
                        bill["seconds"] <= goal["seconds"],
                    ),
                    target(
                        f"... in <= {goal['rss_mb']:g} MB peak RSS",
                        f"{bill['peak_rss_mb']:.0f} MB",
                        bill["peak_rss_mb"] <= goal["rss_mb"],
                    ),
                ]
                break
    return found


def markdown(report: dict) -> str:
    out = [
        "| configuration | pods | raw series | raw samples | recorded series | recorded samples | hourly samples "
        "| path | bill (median) | peak RSS | Prometheus CPU | Prometheus peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in report["results"]:
        config = Config(result["gpus"], result["days"], result["resolution_s"])
        for path, bill in result["bills"].items():
            out.append(
                f"| {config.label} | {result['pods']:,} | {result['raw_series']:,} | {result['raw_samples']:,} | "
                f"{result.get('recorded_series', 0):,} | {result.get('recorded_samples', 0):,} | "
                f"{result.get('hourly_samples', 0):,} | {path} | "
                f"{bill['seconds']:.1f} s | {bill['peak_rss_mb']:.0f} MB | {bill['prometheus_cpu_s']:.1f} s | "
                f"{bill['prometheus_peak_rss_mb']:.0f} MB |"
            )
    if report["growth"]:
        out += [
            "",
            "| resolution | days | path | sizes | time ratio per step | RSS ratio per step | log-log slope |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in report["growth"]:
            ratios = ", ".join(f"{ratio:.2f}" for ratio in row["time_ratios"])
            rss = ", ".join(f"{ratio:.2f}" for ratio in row["rss_ratios"])
            sizes = " → ".join(str(size) for size in row["sizes"])
            where = f"| {row['resolution_s']:g} s | {row['days']:g} | {row['path']} | {sizes} "
            out.append(f"{where}| {ratios} | {rss} | {row['slope']:.2f} |")
    if report["targets"]:
        out += target_table(report["targets"])
    return "\n".join(out) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chargeback_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="512,1024,2048", help="fleet sizes in GPUs, multiples of 8 (default: 512,1024,2048)"
    )
    parser.add_argument(
        "--resolutions", default="300,60", help="seconds between samples and evaluations (default: 300,60)"
    )
    parser.add_argument("--days", type=float, default=1.0, help="length of the range for the sizes above (default: 1)")
    parser.add_argument(
        "--month",
        action="store_true",
        help="also bill 30 days of 2,048 GPUs at 5 minutes (the issue's target), lean, in 3-day blocks (~2 h)",
    )
    parser.add_argument("--month-paths", default="recorded", help="paths for the month (default: recorded)")
    parser.add_argument(
        "--rules",
        choices=("written", "promtool"),
        default="written",
        help="what records the rules' series: the benchmark, from the split of the raw path (written), or "
        "promtool's backfill of the product's own rules (promtool, slow) (default: written)",
    )
    parser.add_argument(
        "--lean",
        action="store_true",
        help="backfill only what a recorded bill reads (no raw series; per-container series only for overreach)",
    )
    parser.add_argument("--block-hours", type=int, default=2, help="hours per TSDB block (default: 2)")
    parser.add_argument(
        "--keep", action="store_true", help="keep each configuration's Prometheus data (say where) for profiling"
    )
    parser.add_argument("--paths", default=",".join(PATHS), help=f"bills to run (default: {','.join(PATHS)})")
    parser.add_argument("--repeats", type=int, default=3, help="bills per path and configuration (default: 3)")
    parser.add_argument("--baseline", metavar="COMMAND", help="another gpu-fence-auditor to bill the raw series with")
    parser.add_argument(
        "--before", metavar="COMMAND", help="another gpu-fence-auditor with both paths, to run each path beside"
    )
    parser.add_argument("--workdir", metavar="DIR", help="where to build each Prometheus (default: a temp dir)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(size) for size in args.sizes.split(",")]
        args.resolutions = [float(value) for value in args.resolutions.split(",")]
    except ValueError:
        parser.error("--sizes and --resolutions: numbers separated by commas")
    args.paths = [path for path in args.paths.split(",") if path]
    args.month_paths = [path for path in args.month_paths.split(",") if path]
    if any(path not in PATHS for path in (*args.paths, *args.month_paths)) or args.repeats < 1:
        parser.error(f"--paths: some of {', '.join(PATHS)}; --repeats >= 1")
    if any(size <= 0 or size % 8 for size in args.sizes) or min(args.resolutions) <= 0 or args.days <= 0:
        parser.error("--sizes: positive multiples of 8; --resolutions and --days: positive")
    if args.lean and ("raw" in args.paths or args.baseline or args.rules == "promtool"):
        parser.error("--lean backfills no raw series: --paths recorded, no --baseline, --rules written")
    if args.block_hours < 2 or args.block_hours % 2:
        parser.error("--block-hours: an even number of hours, at least 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))  # tests.fakes: the Prometheus wrapper lives with the tests
    setup = Setup(rules=args.rules, lean=args.lean, block_hours=args.block_hours)
    configs = [
        (Config(size, args.days, resolution), args.paths, setup)
        for resolution in args.resolutions
        for size in args.sizes
    ]
    if args.month:
        month = Config(TARGET["gpus"], TARGET["days"], TARGET["resolution"])
        configs.append((month, args.month_paths, Setup(lean=True, block_hours=72)))
    results = []
    try:
        for config, paths, how in configs:
            print(f"chargeback_bench: {config.label} ...", file=sys.stderr, flush=True)
            if args.keep:  # for profiling the bills afterwards: the Prometheus data stays, and where it is is said
                work = Path(tempfile.mkdtemp(prefix="gpu-fence-chargeback-", dir=args.workdir))
                print(f"chargeback_bench: keeping {work}", file=sys.stderr, flush=True)
                results.append(run_config(config, paths, args.repeats, work, args.baseline, args.before, how))
                continue
            with tempfile.TemporaryDirectory(prefix="gpu-fence-chargeback-", dir=args.workdir) as directory:
                work = Path(directory)
                results.append(run_config(config, paths, args.repeats, work, args.baseline, args.before, how))
    except BenchError as error:
        print(f"chargeback_bench: {error}", file=sys.stderr)
        return 2
    report = {"machine": machine.describe(), "results": results, "growth": growth(results), "targets": targets(results)}
    publish(report, markdown(report), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
