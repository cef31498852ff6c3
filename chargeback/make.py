"""The bill's making, from :class:`~.settings.Settings`: the source and prices read, the ledger fed, the bill summed.

Reads the files the settings name (prices, cost centres, the HTTP client configuration, the demo fleet), asks the
source for the recording rules' series where they can make the bill (``recorded.py``) and the raw series for the
rest (``raw.py``), and returns the bill with how it was made; :func:`render` writes it in a format, and
:func:`rules_document` writes the recording rules instead. Every expected failure is a ChargebackError.
"""

from __future__ import annotations

import dataclasses
import sys

from gpu_fence.version import package_version

from . import raw, recorded
from . import render as text
from . import rules as recording_rules
from .bill import Bill, TimePoint
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
from .prometheus import InstantSource, PrometheusClient, Source
from .provenance import Provenance, Series
from .settings import Format, SeriesChoice, Settings, default_step, default_timeout, milliseconds
from .times import iso


@dataclasses.dataclass(frozen=True)
class _Inputs:
    source: Source
    prices: Prices
    start: float
    end: float
    prices_source: str  # how an unpriced card's message names the price list


def _prices(settings: Settings) -> tuple[Prices | None, str]:
    if settings.prices is not None:
        return load_prices(settings.prices), f"price file {settings.prices}"
    if settings.price_per_gpu_hour is not None:
        return Prices.flat(settings.price_per_gpu_hour), "the price list"
    return None, "the demo fleet's price list"


def _inputs(settings: Settings) -> _Inputs:
    """Where the series and prices come from, and the range: Prometheus with the options given, or the demo."""
    prices, named = _prices(settings)
    if settings.demo:
        fleet = load_fleet()
        start = settings.start if settings.start is not None else fleet.start
        end = settings.end if settings.end is not None else fleet.end
        return _Inputs(SeriesSource(fleet.series), prices or fleet.prices, start, end, named)
    # settings_from made sure of these without --demo
    assert settings.prometheus and settings.start is not None and settings.end is not None and prices is not None
    start, end = settings.start, settings.end
    http_config = load_http_config(settings.http_config) if settings.http_config else None
    timeout = settings.timeout if settings.timeout is not None else default_timeout(end - start)
    defaulted = (
        "" if settings.timeout is not None else f"the default --timeout for a {(end - start) / 86400:.3g}-day range"
    )
    client = PrometheusClient(settings.prometheus, timeout=timeout, http_config=http_config, timeout_said=defaulted)
    return _Inputs(client, prices, start, end, named)


def _refuse_unpriced(ledger: Ledger, named: str) -> None:
    if ledger.unpriced:
        node, model = sorted(ledger.unpriced)[0]
        raise ChargebackError(
            f"{named} has no price for GPU model {model!r} on node {node!r} ({len(ledger.unpriced)} "
            "model/node pair(s) unpriced): add it under models: or nodes:, or set default:"
        )


def _schedule(
    settings: Settings, source: Source, span: tuple[float, float], *, step: float | None, progress: Progress
) -> recorded.Plan | None:
    """The recording rules' evaluations that make this bill, or None when it is made from the raw series."""
    if settings.series is SeriesChoice.RAW:
        return None
    if not isinstance(source, InstantSource):  # the demo fleet: raw series only
        if settings.series is SeriesChoice.RECORDED:
            raise ChargebackError("--series recorded: the demo fleet has no recording rules' series (try --series raw)")
        return None
    try:
        return recorded.plan(source, *span, step=step, by=settings.by, progress=progress)
    except recorded.NotRecorded:
        if settings.series is SeriesChoice.RECORDED:
            raise
        return None


def make_bill(settings: Settings, progress: Progress | None = None) -> tuple[Bill, Provenance]:
    """Everything but the writing. Raises ChargebackError with a fix-it message."""
    progress = progress or Progress.for_terminal(sys.stderr, quiet=True)
    inputs = _inputs(settings)
    # Prometheus keeps time in whole milliseconds and evaluates a range query at start + k × step in them: the
    # instants computed here must be the same numbers, or samples miss their interval and are dropped.
    start, end = milliseconds(inputs.start), milliseconds(inputs.end)
    if start >= end:
        raise ChargebackError(f"--start ({iso(start)}) must be before --end ({iso(end)})")
    step = settings.step
    if step is not None and (end - start) // step < 1:
        raise ChargebackError(f"the range {iso(start)} .. {iso(end)} is shorter than one --step ({step:g} s)")
    by = settings.by
    centres = load_cost_centres(settings.cost_centres, by) if settings.cost_centres is not None else CostCentres()
    prices = inputs.prices
    ledger = Ledger(prices.per_hour, settings.method)
    found = raw.RawNotes()
    notes: list[str] = []
    schedule = _schedule(settings, inputs.source, (start, end), step=step, progress=progress)
    timeline: list[TimePoint]
    if schedule is not None:
        assert isinstance(inputs.source, InstantSource)  # _schedule plans only for one
        progress.expect(progress.done + schedule.queries)
        timeline = recorded.book(inputs.source, schedule, ledger, by, notes=found, progress=progress)
        _refuse_unpriced(ledger, inputs.prices_source)
        interval, instants = schedule.interval, schedule.missing
        billed = list(schedule.evaluations)
        notes += _recorded_notes(schedule, start, end)
    else:
        interval = step or default_step(end - start)
        count = int((end - start) // interval)
        if count < 1:
            raise ChargebackError(f"the range {iso(start)} .. {iso(end)} is shorter than one --step ({interval:g} s)")
        instants = [start + interval * index for index in range(1, count + 1)]
        billed = instants
        timeline = []
        if count * interval < end - start:
            notes.append(
                f"the range was cut to {iso(start + count * interval)}, a whole number of {interval:g} s steps"
            )
    for sample in raw.stream_intervals(inputs.source, instants, interval, by, notes=found, progress=progress):
        ledger.add(sample)
        _refuse_unpriced(ledger, inputs.prices_source)
    if not ledger.cards:
        raise raw.no_data(inputs.source, start, end)
    if schedule is None and by != "namespace" and not found.labels_seen:
        raise raw.no_label(by, start, end)
    ledger.timeline = recorded.merge_timeline(timeline, ledger.timeline)
    bill = ledger.bill(settings.idle, prices.currency, notes=[*found.notes(), *notes])
    if settings.compare_device_metrics:
        bill = dataclasses.replace(
            bill, comparison=_compare(inputs.source, prices, by, bill, instants=billed, step=interval)
        )
    made = Provenance(
        generated_at=settings.now,
        version=package_version(),
        source=inputs.source.name,
        step=interval,
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
    if milliseconds(schedule.start) != start or milliseconds(schedule.last) != end:
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
    Format.TABLE: text.render_table,
    Format.CSV: text.render_csv,
    Format.JSON: text.render_json,
    Format.MARKDOWN: text.render_markdown,
    Format.HTML: render_html,
    Format.FOCUS: render_focus,
}


def render(bill: Bill, made: Provenance, output_format: Format) -> str:
    return RENDERERS[output_format](bill, made)


def rules_document(settings: Settings) -> str:
    """``--rules``: the chargeback recording rules as a Prometheus rules file."""
    interval = settings.step if settings.step is not None else recording_rules.DEFAULT_INTERVAL
    prices, _named = _prices(settings)
    return recording_rules.rules_file(interval, prices, settings.pod_labels)
