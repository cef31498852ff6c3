"""``gpu-fence-auditor chargeback``: a GPU bill per namespace or team label from the auditor's metrics.

Reads from Prometheus (``prometheus``, with ``httpconfig`` for TLS and credentials) either the chargeback recording
rules' series (``rules`` writes the rules, ``recorded`` sums what they recorded) or the auditor's raw series in
bounded chunks (``raw``), or the bundled sample fleet (``demo``); prices cards (``prices``), splits their cost
(``ledger``, pure, into a ``bill``) and writes a table, CSV, JSON, markdown (``render``), FOCUS rows (``focus``) or
a self-contained HTML report (``html``), each saying how it was made (``provenance``). The method is in
``docs/chargeback.md``; a long bill shows its progress on a terminal (``progress``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import math
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from gpu_fence.exit_status import ExitStatus
from gpu_fence.metric_names import label_name
from gpu_fence.version import package_version

from . import raw, recorded
from . import render as text
from . import rules as recording_rules
from .bill import Bill, IdlePolicy, Method
from .comparison import DeviceMetricBill
from .costcentres import CostCentres, load_cost_centres
from .demo import SeriesSource, load_fleet
from .devicemetrics import device_metric_bill, fetch_device_metrics
from .errors import ChargebackError
from .focus import render_focus
from .html import render_html
from .httpconfig import load_http_config
from .ledger import Ledger
from .prices import Prices, applied_prices, load_prices
from .progress import Progress
from .prometheus import PrometheusClient, Source
from .provenance import Provenance, Series
from .times import iso, parse_duration, parse_time

FORMATS = ("table", "csv", "json", "markdown", "html", "focus")
SERIES = ("auto", "recorded", "raw")
# Default resolution: at most this many instants over the range, and never finer than a minute.
TARGET_POINTS = 2000
# Finer steps only repeat the same scraped sample, and a tiny one would make billions of instants.
MIN_STEP = 1.0
# The default --timeout grows with the range (a month's sums read a month of samples): 30 s, 10 s more per day.
TIMEOUT_BASE, TIMEOUT_PER_DAY, TIMEOUT_MOST = 30.0, 10.0, 900.0


def default_timeout(seconds: float) -> float:
    """The default --timeout for a range of ``seconds``: what a 2-core Prometheus needs for it, with room."""
    return min(TIMEOUT_MOST, TIMEOUT_BASE + TIMEOUT_PER_DAY * max(0.0, seconds) / 86400)


EPILOG = """\
examples:
  gpu-fence-auditor chargeback --demo --format html --output demo-bill.html
  gpu-fence-auditor chargeback --prometheus http://prometheus:9090 --start -30d --end now \\
      --by label:team --prices prices.yaml --format html --output gpu-bill.html
  gpu-fence-auditor chargeback --prometheus https://mimir.example.com/prometheus --http-config prom-http.yaml \\
      --start 2026-01-01T00:00:00Z --end 2026-02-01T00:00:00Z --price-per-gpu-hour 2.50 --format focus
  gpu-fence-auditor chargeback --rules --step 5m --pod-label team --output gpu-fence-chargeback-rules.yaml
  gpu-fence-auditor chargeback --prometheus http://prometheus:9090 --start -7d --prices prices.yaml \\
      --compare-device-metrics      # beside it, what a bill from dcgm-exporter's per-pod series would say

times: RFC 3339 (2026-01-31T00:00:00Z), unix seconds, now, or relative (-7d, -12h, -30m)
prices file (YAML): currency: USD / default: 2.50 / models: {"NVIDIA H100 80GB HBM3": 4.00} / nodes: {"spot-*": 1.10}
cost centres (YAML): namespaces: {genai: "4100"} / labels: {team: {ml: "4100"}} / platform: "9000" / default: "9999"
http config (YAML, as in Prometheus): basic_auth, authorization (credentials_file), tls_config, http_headers
series: with the recording rules loaded (--rules), a month's bill is a few sum_over_time queries (--series auto
  uses them when they can make this bill, and computes any evaluation they missed from the raw series)
exit codes: 0 bill written, 2 could not make it (the reason is one line on stderr)
"""


def add_arguments(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chargeback",
        help="bill GPU cost per namespace or pod label from the auditor's metrics in Prometheus",
        description="Charge each GPU's (or MIG slice's) cost to the containers that held it: idle holders pay "
        "what they reserved, memory splits what is in use; idle capacity, overreach and unattributed memory are "
        "shown apart, next to the request-based cost. --demo bills a bundled sample fleet without a cluster.",
        epilog=EPILOG,
    )
    # Let "--start -7d" through: argparse only lets plain negative numbers stand as values, not durations.
    parser._negative_number_matcher = re.compile(r"^-(\d+(\.\d+)?[smhdw]?)+$")
    parser.add_argument(
        "--prometheus", metavar="URL", help="Prometheus base URL (http or https); required unless --demo"
    )
    parser.add_argument(
        "--http-config",
        type=Path,
        metavar="FILE",
        help="Prometheus HTTP client config (YAML): basic_auth, authorization, tls_config, http_headers",
    )
    parser.add_argument(
        "--demo", action="store_true", help="bill the bundled sample fleet (one day, four nodes) instead of Prometheus"
    )
    parser.add_argument("--start", metavar="T", help="start of the range (required unless --demo)")
    parser.add_argument("--end", metavar="T", help="end of the range (default: now; with --demo, the fleet's day)")
    parser.add_argument(
        "--step",
        metavar="S",
        help=f"resolution, at least {MIN_STEP:g} s, e.g. 60s or 5m "
        f"(default: range / {TARGET_POINTS} rounded up to whole minutes, at least 60 s)",
    )
    parser.add_argument(
        "--by", default="namespace", metavar="namespace|label:KEY", help="group by namespace or a pod label"
    )
    prices = parser.add_mutually_exclusive_group()
    prices.add_argument("--price-per-gpu-hour", type=float, metavar="N", help="one price for every card")
    prices.add_argument("--prices", type=Path, metavar="FILE", help="YAML price list per model / node")
    parser.add_argument(
        "--cost-centres",
        type=Path,
        metavar="FILE",
        help="YAML mapping namespaces (or pod label values, with --by label:KEY) to cost centres: each row names "
        "its cost centre and every format sums the rows per cost centre",
    )
    parser.add_argument(
        "--method",
        choices=[method.value for method in Method],
        default=Method.HOLDER.value,
        help="holder (default): a held GPU with no memory in use is charged to its holder; "
        "usage: only memory is charged, a held idle GPU is idle capacity",
    )
    parser.add_argument(
        "--idle",
        choices=[policy.value for policy in IdlePolicy],
        default=IdlePolicy.PROPORTIONAL.value,
        help="who pays for idle capacity: the card's users, in proportion (default), or a platform row",
    )
    parser.add_argument(
        "--series",
        choices=SERIES,
        default="auto",
        help="recorded: sum the chargeback recording rules' series (fast; evaluations they missed come from the "
        "raw series); raw: split the auditor's series here, in bounded chunks; auto (default): recorded when the "
        "rules can make this bill (same --step, grouping label rolled up), else raw",
    )
    parser.add_argument(
        "--compare-device-metrics",
        action="store_true",
        help="also read dcgm-exporter's DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_GPU_UTIL from the same Prometheus and "
        "show, per group, the bill a device-metric method would make (device-hours and utilisation) beside this one, "
        "with the sum over groups against what the cards cost; not with --demo or --format focus",
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="report format")
    parser.add_argument("--output", "-o", type=Path, metavar="FILE", help="write here instead of stdout")
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help=f"per Prometheus request (default: {TIMEOUT_BASE:g} s, {TIMEOUT_PER_DAY:g} s more per day of the range, "
        f"at most {TIMEOUT_MOST:g} s)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line on stderr (shown only on a terminal)")
    parser.add_argument(
        "--rules",
        action="store_true",
        help="write the chargeback recording rules (a Prometheus rules file) instead of a bill: evaluated every "
        "--step (default 5m), rolled up by --pod-label keys; with --prices or --price-per-gpu-hour, also each "
        "card's price as a series, for dashboards",
    )
    parser.add_argument(
        "--pod-label",
        action="append",
        metavar="KEY",
        help=f"with --rules: a pod label the rollups carry, as the auditor's --pod-label (repeatable; default: "
        f"{', '.join(recording_rules.DEFAULT_POD_LABELS)})",
    )
    parser.set_defaults(run=run)


def _validate_by(by: str) -> str:
    if by == "namespace":
        return by
    if by.startswith("label:") and by.removeprefix("label:").strip():
        key = by.removeprefix("label:").strip()
        if not re.fullmatch(r"[A-Za-z0-9_./-]+", key):
            raise ChargebackError(f"--by {by!r}: {key!r} is not a Kubernetes label key")
        return f"label:{key}"
    raise ChargebackError(f"--by {by!r}: expected namespace or label:KEY (e.g. label:team)")


def _milliseconds(seconds: float) -> float:
    return round(seconds * 1000) / 1000


def default_step(seconds: float) -> float:
    return max(60.0, math.ceil(seconds / TARGET_POINTS / 60.0) * 60.0)


@dataclasses.dataclass(frozen=True)
class _Inputs:
    source: Source
    prices: Prices
    start: float
    end: float
    prices_source: str  # how an unpriced card's message names the price list


def _inputs(args: argparse.Namespace, now: float) -> _Inputs:
    """Where the series and prices come from, and the range: Prometheus with the options given, or the demo."""
    if args.prices is not None:
        prices, named = load_prices(args.prices), f"price file {args.prices}"
    elif args.price_per_gpu_hour is not None:
        prices, named = Prices.flat(args.price_per_gpu_hour), "the price list"
    else:
        prices, named = None, "the demo fleet's price list"
    if args.compare_device_metrics and args.demo:
        raise ChargebackError(
            "--compare-device-metrics reads dcgm-exporter's series from --prometheus: the demo fleet has none"
        )
    if args.demo:
        if args.prometheus or args.http_config:
            raise ChargebackError("--demo bills the bundled sample fleet: leave out --prometheus and --http-config")
        fleet = load_fleet()
        start = parse_time(args.start, now, "--start") if args.start else fleet.start
        end = parse_time(args.end, now, "--end") if args.end else fleet.end
        return _Inputs(SeriesSource(fleet.series), prices or fleet.prices, start, end, named)
    if not args.prometheus:
        raise ChargebackError("--prometheus URL is required (or try --demo for a bill over a bundled sample fleet)")
    if not args.start:
        raise ChargebackError("--start is required: the start of the range to bill, e.g. -30d or 2026-01-01T00:00:00Z")
    if prices is None:
        raise ChargebackError("give prices: --price-per-gpu-hour N, or --prices FILE (a price list per model/node)")
    start = parse_time(args.start, now, "--start")
    end = parse_time(args.end or "now", now, "--end")
    if args.timeout is not None and (not math.isfinite(args.timeout) or args.timeout <= 0):
        raise ChargebackError(f"--timeout {args.timeout:g}: must be a number of seconds greater than zero")
    http_config = load_http_config(args.http_config) if args.http_config else None
    timeout = args.timeout if args.timeout is not None else default_timeout(end - start)
    defaulted = "" if args.timeout is not None else f"the default --timeout for a {(end - start) / 86400:.3g}-day range"
    client = PrometheusClient(args.prometheus, timeout=timeout, http_config=http_config, timeout_said=defaulted)
    return _Inputs(client, prices, start, end, named)


def _refuse_unpriced(ledger: Ledger, named: str) -> None:
    if ledger.unpriced:
        node, model = sorted(ledger.unpriced)[0]
        raise ChargebackError(
            f"{named} has no price for GPU model {model!r} on node {node!r} ({len(ledger.unpriced)} "
            "model/node pair(s) unpriced): add it under models: or nodes:, or set default:"
        )


def _schedule(
    args: argparse.Namespace, inputs: _Inputs, span: tuple[float, float], *, step: float | None, progress: Progress
) -> recorded.Plan | None:
    """The recording rules' evaluations that make this bill, or None when it is made from the raw series."""
    if args.series == "raw":
        return None
    if not hasattr(inputs.source, "query"):  # the demo fleet: raw series only
        if args.series == "recorded":
            raise ChargebackError("--series recorded: the demo fleet has no recording rules' series (try --series raw)")
        return None
    try:
        return recorded.plan(inputs.source, *span, step=step, by=_validate_by(args.by), progress=progress)  # type: ignore[arg-type]
    except recorded.NotRecorded:
        if args.series == "recorded":
            raise
        return None


def make_bill(args: argparse.Namespace, now: float, progress: Progress | None = None) -> tuple[Bill, Provenance]:
    """Everything but the writing. Raises ChargebackError with a fix-it message."""
    progress = progress or Progress.for_terminal(sys.stderr, quiet=True)
    inputs = _inputs(args, now)
    # Prometheus keeps time in whole milliseconds and evaluates a range query at start + k × step in them: the
    # instants computed here must be the same numbers, or samples miss their interval and are dropped.
    start, end = _milliseconds(inputs.start), _milliseconds(inputs.end)
    if start >= end:
        raise ChargebackError(f"--start ({iso(start)}) must be before --end ({iso(end)})")
    step = _milliseconds(parse_duration(args.step)) if args.step else None
    if step is not None and step < MIN_STEP:
        raise ChargebackError(
            f"--step {args.step!r}: must be at least {MIN_STEP:g} s (auditor samples are scrape intervals apart)"
        )
    if step is not None and (end - start) // step < 1:
        raise ChargebackError(f"the range {iso(start)} .. {iso(end)} is shorter than one --step ({step:g} s)")
    by = _validate_by(args.by)
    centres = load_cost_centres(args.cost_centres, by) if args.cost_centres is not None else CostCentres()
    if args.compare_device_metrics and args.format == "focus":
        raise ChargebackError(
            "--compare-device-metrics with --format focus: FOCUS rows are charges, and a comparison is not one; "
            "use another --format"
        )
    prices, method = inputs.prices, Method(args.method)
    ledger = Ledger(prices.per_hour, method)
    found = raw.RawNotes()
    notes: list[str] = []
    schedule = _schedule(args, inputs, (start, end), step=step, progress=progress)
    if schedule is not None:
        progress.expect(progress.done + schedule.queries)
        timeline = recorded.book(inputs.source, schedule, ledger, by, notes=found, progress=progress)  # type: ignore[arg-type]
        _refuse_unpriced(ledger, inputs.prices_source)
        step, instants = schedule.interval, schedule.missing
        billed = list(schedule.evaluations)
        notes += _recorded_notes(schedule, start, end)
    else:
        step = step or default_step(end - start)
        count = int((end - start) // step)
        if count < 1:
            raise ChargebackError(f"the range {iso(start)} .. {iso(end)} is shorter than one --step ({step:g} s)")
        instants = [start + step * index for index in range(1, count + 1)]
        billed = instants
        timeline = []
        if count * step < end - start:
            notes.append(f"the range was cut to {iso(start + count * step)}, a whole number of {step:g} s steps")
    for interval in raw.stream_intervals(inputs.source, instants, step, by, notes=found, progress=progress):
        ledger.add(interval)
        _refuse_unpriced(ledger, inputs.prices_source)
    if not ledger.cards:
        raise raw.no_data(inputs.source, start, end)
    if schedule is None and by != "namespace" and not found.labels_seen:
        raise raw.no_label(by, start, end)
    ledger.timeline = recorded.merge_timeline(timeline, ledger.timeline)
    bill = ledger.bill(IdlePolicy(args.idle), prices.currency, notes=[*found.notes(), *notes])
    if args.compare_device_metrics:
        bill = dataclasses.replace(
            bill, comparison=_compare(inputs.source, prices, by, bill, instants=billed, step=step)
        )
    made = Provenance(
        generated_at=now,
        version=package_version(),
        source=inputs.source.name,
        step=step,
        group_by=by,
        prices=applied_prices(prices, [(card.node, card.model) for card in bill.cards]),
        series=Series.RAW if schedule is None else Series.RECORDED,
        hourly_sums=0 if schedule is None else schedule.hourly_sums,
        cost_centres=centres,
    )
    return bill, made


def _compare(
    source: Source, prices: Prices, by: str, bill: Bill, *, instants: list[float], step: float
) -> DeviceMetricBill:
    """--compare-device-metrics: dcgm-exporter's series billed two device-metric ways at the bill's instants."""
    fb_used, gpu_util, group_of = fetch_device_metrics(source, instants, step, by)
    return device_metric_bill(
        instants,
        step,
        fb_used=fb_used,
        gpu_util=gpu_util,
        price_of=prices.per_hour,
        group_of=group_of,
        gpu_fence={group.group: group.total for group in bill.groups},
        gpu_fence_rest=max(0.0, bill.total_gpu_cost - sum(group.total for group in bill.groups)),
        real_cost=bill.total_gpu_cost,
    )


def _recorded_notes(schedule: recorded.Plan, start: float, end: float) -> list[str]:
    notes = []
    if _milliseconds(schedule.start) != start or _milliseconds(schedule.last) != end:
        notes.append(
            f"the recording rules evaluate every {schedule.interval:g} s at {iso(schedule.first)} and every "
            f"{schedule.interval:g} s from there: the bill covers {iso(schedule.start)} .. {iso(schedule.last)}, the "
            "evaluations in the range asked for (start and end on that grid to bill exactly the range)"
        )
    missing = len(schedule.missing)
    if missing:
        notes.append(
            f"{missing} of {len(schedule.evaluations)} evaluations of the recording rules are missing from "
            "Prometheus (down, or the rules loaded later): they were computed from the raw series"
        )
    return notes


RENDERERS = {
    "table": text.render_table,
    "csv": text.render_csv,
    "json": text.render_json,
    "markdown": text.render_markdown,
    "html": render_html,
    "focus": render_focus,
}


def render(bill: Bill, made: Provenance, output_format: str) -> str:
    return RENDERERS[output_format](bill, made)


def rules_document(args: argparse.Namespace) -> str:
    """``--rules``: the chargeback recording rules as a Prometheus rules file."""
    interval = _milliseconds(parse_duration(args.step)) if args.step else recording_rules.DEFAULT_INTERVAL
    if interval < MIN_STEP:
        raise ChargebackError(f"--step {args.step!r}: the rules' interval must be at least {MIN_STEP:g} s")
    keys = args.pod_label if args.pod_label is not None else list(recording_rules.DEFAULT_POD_LABELS)
    for key in keys:
        if not re.fullmatch(r"[A-Za-z0-9_./-]+", key):
            raise ChargebackError(f"--pod-label {key!r}: not a Kubernetes label key")
    if len({label_name(key) for key in keys}) < len(keys):
        raise ChargebackError(f"--pod-label {' '.join(keys)}: two keys become the same Prometheus label name")
    if args.prices is not None:
        prices: Prices | None = load_prices(args.prices)
    elif args.price_per_gpu_hour is not None:
        prices = Prices.flat(args.price_per_gpu_hour)
    else:
        prices = None
    return recording_rules.rules_file(interval, prices, keys)


@contextlib.contextmanager
def paused_collector() -> Iterator[None]:
    """Python's cyclic garbage collector off for a bill, back as it was after. A bill builds hundreds of thousands
    of small objects that live until the report (the ledger's lines, the answers being booked), and the collector
    re-scanned them all over and over: a third of a raw bill's time (BENCHMARKS.md). Nothing a bill keeps needs
    the collector; reference counting frees the rest as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run(args: argparse.Namespace) -> ExitStatus:
    progress = Progress.for_terminal(sys.stderr, quiet=args.quiet)
    try:
        if args.rules:
            document = rules_document(args)
        else:
            with paused_collector():
                bill, made = make_bill(args, float(int(time.time())), progress)  # bills name times to the second
                document = render(bill, made, args.format)
        progress.finish()
        if args.output:
            try:
                args.output.write_text(document, encoding="utf-8")
            except OSError as error:
                raise ChargebackError(f"cannot write --output {args.output}: {error.strerror or error}") from None
        else:
            sys.stdout.write(document)
    except ChargebackError as error:
        progress.finish()
        print(f"gpu-fence-auditor chargeback: error: {error}", file=sys.stderr)
        return ExitStatus.ERROR
    return ExitStatus.SUCCESS
