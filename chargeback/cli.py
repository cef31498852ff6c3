"""``gpu-fence-auditor chargeback``'s command line: its parser, and :func:`run`, which the auditor's ``main`` calls.

The parsed flags become one :class:`~.settings.Settings` (``settings.py``), the bill is made from it (``make.py``)
and written to stdout or ``--output``; every expected failure is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from gpu_fence.exit_status import ExitStatus

from . import rules as recording_rules
from .bill import IdlePolicy, Method
from .errors import ChargebackError
from .progress import Progress
from .settings import (
    MIN_STEP,
    TARGET_POINTS,
    TIMEOUT_BASE,
    TIMEOUT_MOST,
    TIMEOUT_PER_DAY,
    Format,
    SeriesChoice,
    settings_from,
)

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


def add_arguments(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        choices=[choice.value for choice in SeriesChoice],
        default=SeriesChoice.AUTO.value,
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
    parser.add_argument(
        "--format", choices=[choice.value for choice in Format], default=Format.TABLE.value, help="report format"
    )
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
    # The bill's making (Prometheus' client, the renderers) is imported only by a chargeback run: every process of
    # gpu-fence-auditor builds this parser, and the node's auditor should not carry the bill's modules.
    from . import make  # noqa: PLC0415

    progress = Progress.for_terminal(sys.stderr, quiet=args.quiet)
    try:
        settings = settings_from(args, float(int(time.time())))  # bills name times to the second
        if settings.rules:
            document = make.rules_document(settings)
        else:
            with paused_collector():
                bill, made = make.make_bill(settings, progress)
                document = make.render(bill, made, settings.format)
        progress.finish()
        if settings.output:
            try:
                settings.output.write_text(document, encoding="utf-8")
            except OSError as error:
                raise ChargebackError(f"cannot write --output {settings.output}: {error.strerror or error}") from None
        else:
            sys.stdout.write(document)
    except ChargebackError as error:
        progress.finish()
        print(f"gpu-fence-auditor chargeback: error: {error}", file=sys.stderr)
        return ExitStatus.ERROR
    return ExitStatus.SUCCESS
