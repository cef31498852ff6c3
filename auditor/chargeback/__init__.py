"""``gpu-fence-auditor chargeback``: a GPU bill per namespace or team label from the auditor's metrics.

Reads the auditor's series from Prometheus (``prometheus``, with ``httpconfig`` for TLS and credentials) or from
the bundled sample fleet (``demo``), prices cards (``prices``), splits their cost (``compute``, pure) and writes a
table, CSV, JSON, markdown (``render``), FOCUS rows (``focus``) or a self-contained HTML report (``html``), each
saying how it was made (``provenance``). The method is in ``docs/chargeback.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import time
from pathlib import Path

from gpu_fence.exit_status import ExitStatus
from gpu_fence.version import package_version

from . import render as text
from .compute import Bill, IdlePolicy, Method, card_models, compute_bill
from .demo import SeriesSource, load_fleet
from .devicemetrics import device_metric_bill, fetch_device_metrics
from .errors import ChargebackError
from .focus import render_focus
from .html import render_html
from .httpconfig import load_http_config
from .prices import Prices, applied_prices, load_prices
from .prometheus import PrometheusClient, Source, fetch_intervals, grouping, instants_of
from .provenance import Provenance
from .times import iso, parse_duration, parse_time

FORMATS = ("table", "csv", "json", "markdown", "html", "focus")
# Default resolution: at most this many instants over the range, and never finer than a minute.
TARGET_POINTS = 2000
# Finer steps only repeat the same scraped sample, and a tiny one would make billions of instants.
MIN_STEP = 1.0

EPILOG = """\
examples:
  gpu-fence-auditor chargeback --demo --format html --output demo-bill.html
  gpu-fence-auditor chargeback --prometheus http://prometheus:9090 --start -30d --end now \\
      --by label:team --prices prices.yaml --format html --output gpu-bill.html
  gpu-fence-auditor chargeback --prometheus https://mimir.example.com/prometheus --http-config prom-http.yaml \\
      --start 2026-01-01T00:00:00Z --end 2026-02-01T00:00:00Z --price-per-gpu-hour 2.50 --format focus
  gpu-fence-auditor chargeback --prometheus http://prometheus:9090 --start -7d --prices prices.yaml \\
      --compare-device-metrics      # beside it, what a bill from dcgm-exporter's per-pod series would say

times: RFC 3339 (2026-01-31T00:00:00Z), unix seconds, now, or relative (-7d, -12h, -30m)
prices file (YAML): currency: USD / default: 2.50 / models: {"NVIDIA H100 80GB HBM3": 4.00} / nodes: {"spot-*": 1.10}
http config (YAML, as in Prometheus): basic_auth, authorization (credentials_file), tls_config, http_headers
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
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        "--compare-device-metrics",
        action="store_true",
        help="also read dcgm-exporter's DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_GPU_UTIL from the same Prometheus and "
        "show, per group, the bill a device-metric method would make (device-hours and utilisation) beside this one, "
        "with the sum over groups against what the cards cost; not with --demo or --format focus",
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="report format")
    parser.add_argument("--output", "-o", type=Path, metavar="FILE", help="write here instead of stdout")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS", help="per Prometheus request")
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
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise ChargebackError(f"--timeout {args.timeout:g}: must be a number of seconds greater than zero")
    http_config = load_http_config(args.http_config) if args.http_config else None
    client = PrometheusClient(args.prometheus, timeout=args.timeout, http_config=http_config)
    return _Inputs(client, prices, start, end, named)


def make_bill(args: argparse.Namespace, now: float) -> tuple[Bill, Provenance]:
    """Everything but the writing. Raises ChargebackError with a fix-it message."""
    inputs = _inputs(args, now)
    # Prometheus keeps time in whole milliseconds and evaluates a range query at start + k × step in them: the
    # instants computed here must be the same numbers, or samples miss their interval and are dropped.
    start, end = _milliseconds(inputs.start), _milliseconds(inputs.end)
    if start >= end:
        raise ChargebackError(f"--start ({iso(start)}) must be before --end ({iso(end)})")
    step = _milliseconds(parse_duration(args.step)) if args.step else default_step(end - start)
    if step < MIN_STEP:
        raise ChargebackError(
            f"--step {args.step!r}: must be at least {MIN_STEP:g} s (auditor samples are scrape intervals apart)"
        )
    count = int((end - start) // step)
    if count < 1:
        raise ChargebackError(f"the range {iso(start)} .. {iso(end)} is shorter than one --step ({step:g} s)")
    by = _validate_by(args.by)
    if args.compare_device_metrics and args.format == "focus":
        raise ChargebackError(
            "--compare-device-metrics with --format focus: FOCUS rows are charges, and a comparison is not one; "
            "use another --format"
        )
    prices = inputs.prices
    group_of = grouping(inputs.source, by, start + step, start + count * step, step)
    intervals, notes = fetch_intervals(inputs.source, start, step, count, group_of)
    missing = sorted(
        {
            (card[0], model)
            for interval in intervals
            for card, model in card_models(interval.devices).items()
            if prices.per_hour(card[0], model) is None
        }
    )
    if missing:
        node, model = missing[0]
        raise ChargebackError(
            f"{inputs.prices_source} has no price for GPU model {model!r} on node {node!r} ({len(missing)} "
            "model/node pair(s) unpriced): add it under models: or nodes:, or set default:"
        )
    bill = compute_bill(
        intervals, prices.per_hour, IdlePolicy(args.idle), currency=prices.currency, method=Method(args.method)
    )
    if count * step < end - start:
        notes.append(f"the range was cut to {iso(start + count * step)}, a whole number of {step:g} s steps")
    if args.compare_device_metrics:
        fb_used, gpu_util = fetch_device_metrics(inputs.source, start, step, count)
        comparison = device_metric_bill(
            instants_of(start, step, count),
            step,
            fb_used=fb_used,
            gpu_util=gpu_util,
            price_of=prices.per_hour,
            group_of=group_of,
            gpu_fence={group.group: group.total for group in bill.groups},
            gpu_fence_rest=max(0.0, bill.total_gpu_cost - sum(group.total for group in bill.groups)),
            real_cost=bill.total_gpu_cost,
        )
        bill = dataclasses.replace(bill, comparison=comparison)
    if notes:
        bill = dataclasses.replace(bill, notes=(*notes, *bill.notes))
    made = Provenance(
        generated_at=now,
        version=package_version(),
        source=inputs.source.name,
        step=step,
        group_by=by,
        prices=applied_prices(prices, [(card.node, card.model) for card in bill.cards]),
    )
    return bill, made


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


def run(args: argparse.Namespace) -> ExitStatus:
    try:
        bill, made = make_bill(args, time.time())
        document = render(bill, made, args.format)
        if args.output:
            try:
                args.output.write_text(document, encoding="utf-8")
            except OSError as error:
                raise ChargebackError(f"cannot write --output {args.output}: {error.strerror or error}") from None
        else:
            sys.stdout.write(document)
    except ChargebackError as error:
        print(f"gpu-fence-auditor chargeback: error: {error}", file=sys.stderr)
        return ExitStatus.ERROR
    return ExitStatus.SUCCESS
