"""A self-contained HTML bill: one file with inline CSS and inline SVG charts, nothing loaded from anywhere.

Written for a finance reader who has never used Prometheus: the headline is the TOTAL row, and the rows under it
add up to it to the cent (:mod:`~.statement`); every column has a plain name and a line in the glossary below the
table; the range is said in words; the charts have round ticks and a legend for every colour; the prices are listed
by GPU model. Printed (A4 or Letter), the page drops its margins, keeps each table row and chart whole and repeats
table headers on every page.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from .axes import money_ticks, time_ticks
from .bill import IDLE, OVERREACH, UNATTRIBUTED, Bill, IdlePolicy, Method, TimePoint
from .provenance import Provenance
from .render import (
    CARD_COLUMNS,
    CENTRE_COLUMNS,
    COMPARISON_COLUMNS,
    Columns,
    card_rows,
    centre_rows,
    comparison_lines,
    comparison_rows,
    price_rows,
    shown_columns,
)
from .statement import MONEY, PARTS, SUBTOTAL, RowKind, Statement, statement
from .times import in_words, iso

MAX_BARS = 96
MAX_LAYER_GROUPS = 8
OTHER = "other groups"
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
FIXED_COLOURS = {OTHER: "#c7c7c7", OVERREACH: "#d62728", UNATTRIBUTED: "#ff7f0e", IDLE: "#e8e8e8"}
# What the chart's fixed layers are called for a reader; the data-layer attributes keep the bill's own names.
LAYER_NAMES = {
    OVERREACH: "used without allocation",
    UNATTRIBUTED: "unattributed (outside any container)",
    IDLE: "idle capacity (before the idle setting shares it out)",
}
REQUEST_COLOUR, BILLED_COLOUR = "#9e9e9e", "#1f77b4"
# The A4 page less 12 mm margins (A4 is the narrower of A4 and Letter): what a printed table and chart must fit.
PRINT_WIDTH_MM = 186

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #222; line-height: 1.45; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
.meta { color: #555; margin-top: 0; }
.cards { display: flex; gap: 1rem; flex-wrap: wrap; margin: 1rem 0 .3rem; align-items: stretch; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: .6rem 1rem; min-width: 9rem; }
.card b { display: block; font-size: 1.3rem; font-variant-numeric: tabular-nums; }
.card.headline { border-color: #1f77b4; border-width: 2px; }
.card.op { border: none; min-width: 0; padding: .6rem 0; align-self: center; font-size: 1.4rem; color: #555; }
.within { color: #555; margin: .2rem 0 1rem; }
table { border-collapse: collapse; margin: .5rem 0; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #e4e4e4; padding: .3rem .55rem; vertical-align: top; }
th[scope="col"] { vertical-align: bottom; white-space: normal; max-width: 6.5rem; }
.num { text-align: right; white-space: nowrap; } .text { text-align: left; }
td[data-key="total_cost"], th[data-key="total_cost"] { font-weight: 600; }
tbody th { font-weight: normal; text-align: left; }
caption { caption-side: top; text-align: left; color: #555; padding-bottom: .3rem; }
tr.total td, tr.total th { font-weight: bold; border-top: 2px solid #999; }
tr.subtotal td, tr.subtotal th { font-weight: 600; border-top: 1px solid #999; }
tr.special th { font-style: italic; }
svg { max-width: 100%; height: auto; }
.legend { margin: .3rem 0 1rem; }
.legend span { display: inline-block; margin-right: 1.2rem; }
.legend i { display: inline-block; width: .8rem; height: .8rem; margin-right: .3rem; vertical-align: -1px;
            border: 1px solid #bbb; }
.neg { color: #1a7f37; } .pos { color: #b42318; }
svg text { font-size: 11px; fill: #444; }
svg text.axis-title { font-size: 12px; fill: #222; }
.note { color: #8a5a00; }
dl.glossary { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; margin: .5rem 0 1rem;
               font-size: .9rem; color: #333; }
dl.glossary dt { font-weight: 600; } dl.glossary dd { margin: 0; }
@page { margin: 12mm; }
@media print {
  body { margin: 0; max-width: none; padding: 0; font-size: 9pt; line-height: 1.3; }
  h1 { font-size: 14pt; } h2 { font-size: 11pt; margin-top: 1rem; break-after: avoid; }
  table { font-size: 7.5pt; width: 100%; } th, td { padding: .15rem .3rem; }
  thead { display: table-header-group; }
  tr, .card, .cards, svg, .legend, dl.glossary > * { break-inside: avoid; }
  .card { padding: .3rem .6rem; min-width: 0; } .card b { font-size: 11pt; }
  dl.glossary { font-size: 8pt; }
  svg text { font-size: 10px; }
}
"""


def _money(value: Decimal | float | None) -> str:
    if value is None:
        return "–"
    return f"{value + 0:,.2f}"  # + 0 turns -0.0 into 0.0, so a zero difference never prints as "-0.00"


def _cell(key: str, value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        return html.escape(value)
    return _money(value)  # type: ignore[arg-type]


# --- the cost-per-group table and its glossary --------------------------------------------------------------------


def glossary(bill: Bill, by: str) -> dict[str, str]:
    """What each column and special row means, in words, for this bill's method and idle setting."""
    held = (
        "what the group's allocations blocked on GPUs, MIG slices or time-slicing replicas it put no memory on: under "
        "this bill's method, what an allocation blocks, its holder pays"
        if bill.method is Method.HOLDER
        else "always 0 under method usage, which bills by memory only (a held GPU with no memory on it is idle)"
    )
    idle = (
        "its part of the cards' idle capacity (what nobody held or used), shared out over the parties that used "
        "each card in the range, in proportion to what they were billed on it"
        if bill.idle_policy is IdlePolicy.PROPORTIONAL
        else "0 here: idle capacity is charged to the platform row (--idle platform)"
    )
    return {
        "group": f"the {by}",
        "cost_centre": "the cost centre the group is booked to (--cost-centres)",
        "requested_gpu_hours": "GPU-hours of the allocations the group's pods held, as requests count them: a "
        "time-slicing replica as a GPU, a MIG slice as its share of the card",
        "memory_gib_hours": "GPU memory its containers held, in GiB × hours (the basis of 'used')",
        "usage_cost": "its share of each GPU or MIG slice it put memory on, split by memory with everything else on it",
        "reserved_cost": held,
        "idle_cost": idle,
        "overreach_cost": "memory it put on a GPU or slice it was not allocated (overreach), priced like any use "
        "and charged to it: the party that used the capacity pays for it",
        "total_cost": "what the group is billed: the sum of the columns before it from 'used' on",
        "effective_rate": "total ÷ GPU-h held: what each GPU-hour it held cost it (– where it held none)",
        "request_cost": "what a tool that bills allocations would charge: GPU-h held × the card's price per hour",
        "difference": "total minus by request: green below zero (requests overstate, e.g. a time-sliced GPU billed "
        "once per replica by requests), red above (an idle share, or use without an allocation)",
        "sm_active_gpu_hours": "not billed: how busy its GPUs' compute units were, × hours (– where the driver "
        "does not say, as on MIG)",
    }


ROW_MEANINGS = {
    RowKind.SUBTOTAL: (SUBTOTAL, "the groups above, added up, column by column"),
    RowKind.UNATTRIBUTED: (UNATTRIBUTED, "GPU memory of processes outside any container (on the node itself)"),
    RowKind.PLATFORM: (
        "(platform)",
        "idle capacity charged to nobody: a card no group used in the range, or all idle capacity with --idle platform",
    ),
    RowKind.TOTAL: ("TOTAL", "every row above it: the GPU cost of the range, the headline"),
}


def table_columns(shown: Statement) -> Columns:
    """The columns with data, less the money columns that are 0 in every row (e.g. 'held, unused' under method
    usage): a reader should not scan a column of zeros."""
    return tuple(
        (key, title)
        for key, title in shown_columns(shown)
        if key not in MONEY or any(row.values.get(key) for row in shown.rows)
    )


def _groups_table(bill: Bill, shown: Statement, by: str) -> str:
    columns = table_columns(shown)
    head = "".join(
        f'<th scope="col" class="{"text" if key in ("group", "cost_centre") else "num"}" data-key="{key}">'
        f"{html.escape(title)}</th>"
        for key, title in columns
    )
    body = []
    for row in shown.rows:
        cells = []
        for key, _ in columns:
            value = row.values.get(key)
            css = "text" if key in ("group", "cost_centre") else "num"
            if key == "difference" and isinstance(value, Decimal) and value:
                css += " neg" if value < 0 else " pos"
            tag = "th" if key == "group" else "td"
            scope = ' scope="row"' if tag == "th" else ""
            cells.append(f'<{tag}{scope} class="{css}" data-key="{key}">{_cell(key, value)}</{tag}>')
        kind = {RowKind.GROUP: "group", RowKind.SUBTOTAL: "subtotal", RowKind.TOTAL: "total"}.get(row.kind, "special")
        body.append(f'<tr class="{kind}" data-kind="{row.kind.value}">{"".join(cells)}</tr>')
    parts = [title for key, title in columns if key in PARTS]
    caption = (
        f"GPU cost per {html.escape(by)}, {html.escape(bill.currency)}. Each row's total = "
        f"{html.escape(' + '.join(parts))}; the rows add up to the TOTAL."
    )
    return (
        f'<table id="groups"><caption>{caption}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _glossary(bill: Bill, shown: Statement, by: str) -> str:
    meanings = glossary(bill, by)
    items = [(title, meanings[key]) for key, title in table_columns(shown) if key in meanings]
    items += [ROW_MEANINGS[kind] for kind in (RowKind.SUBTOTAL, RowKind.UNATTRIBUTED, RowKind.PLATFORM, RowKind.TOTAL)]
    entries = "".join(f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>" for term, text in items)
    return f'<dl class="glossary" id="glossary">{entries}</dl>'


def _simple_table(
    table_id: str, caption: str, columns: Columns, records: list[dict[str, Any]], text: Sequence[str]
) -> str:
    """A table whose first column heads each row; ``text`` columns are words (left), the rest figures (right):
    money with cents, ``cards`` as a count, ``hours`` to two places, ``gib_hours`` to one."""
    head = "".join(
        f'<th scope="col" class="{"text" if key in text else "num"}">{html.escape(title)}</th>'
        for key, title in columns
    )
    body = []
    for record in records:
        cells = []
        for index, (key, _) in enumerate(columns):
            value = record.get(key)
            if key in text or isinstance(value, str):
                shown, css = html.escape(str(value)), "text"
            elif key == "cards":
                shown, css = f"{value:g}", "num"
            elif key == "hours":
                shown, css = f"{value:,.2f}", "num"
            elif key == "gib_hours":
                shown, css = f"{value:,.1f}", "num"
            else:
                shown, css = _money(value), "num"
            tag = 'th scope="row"' if index == 0 else "td"
            cells.append(f'<{tag} class="{css}" data-key="{key}">{shown}</{tag[:2]}>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (
        f'<table id="{table_id}"><caption>{html.escape(caption)}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


# --- the charts ---------------------------------------------------------------------------------------------------


def _layers(bill: Bill) -> list[str]:
    using = [group.group for group in bill.groups if group.usage + group.reserved > 0]
    layers = using[:MAX_LAYER_GROUPS]
    if len(using) > len(layers):
        layers.append(OTHER)
    return [*layers, OVERREACH, UNATTRIBUTED, IDLE]


def _buckets(timeline: tuple[TimePoint, ...], layers: list[str]) -> list[tuple[float, float, dict[str, float]]]:
    """Consecutive points merged into at most MAX_BARS bars: (start, end, cost per layer)."""
    if not timeline:
        return []
    size = -(-len(timeline) // MAX_BARS)
    known = set(layers)
    result = []
    for index in range(0, len(timeline), size):
        chunk = timeline[index : index + size]
        costs: dict[str, float] = defaultdict(float)
        for point in chunk:
            for name, cost in point.costs.items():
                costs[name if name in known else OTHER] += cost
        result.append((chunk[0].start, chunk[-1].end, dict(costs)))
    return result


def _colour(layer: str, layers: list[str]) -> str:
    return FIXED_COLOURS.get(layer) or PALETTE[layers.index(layer) % len(PALETTE)]


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _tick_label(value: float, places: int) -> str:
    return f"{value:,.{places}f}"


def _legend(legend_id: str, entries: Sequence[tuple[str, str, str]]) -> str:
    """(colour, label, data-layer) per entry."""
    spans = "".join(
        f'<span data-layer="{html.escape(layer)}"><i style="background:{colour}"></i>{html.escape(label)}</span>'
        for colour, label, layer in entries
    )
    return f'<div class="legend" id="{legend_id}">{spans}</div>'


def _timeline_svg(bill: Bill, step: float) -> str:
    layers = _layers(bill)
    bars = _buckets(bill.timeline, layers)
    width, height, left, bottom, top = 960, 300, 70, 40, 10
    plot_w, plot_h = width - left - 10, height - bottom - top
    ticks, places = money_ticks(max((sum(costs.values()) for _, _, costs in bars), default=0.0))
    peak = ticks[-1]
    bar_w = plot_w / max(1, len(bars))
    bar_seconds = (bars[0][1] - bars[0][0]) if bars else step
    parts = [
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20}" '
        f'viewBox="0 0 {width} {height + 20}" role="img" aria-label="GPU cost over time, stacked by group">',
        f"<title>GPU cost over time, stacked by group, {html.escape(in_words(bill.start, bill.end))}</title>",
    ]
    for value in ticks:
        y = top + plot_h * (1 - value / peak)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(
            f'<text class="money-tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_tick_label(value, places)}</text>"
        )
    unit = html.escape(f"{bill.currency} per {_duration(bar_seconds)} bar")
    parts.append(
        f'<text class="axis-title" id="y-unit" x="14" y="{top + plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{unit}</text>'
    )
    for index, (first, last, costs) in enumerate(bars):
        x = left + index * bar_w
        y = top + plot_h
        for layer in layers:
            cost = costs.get(layer, 0.0)
            if cost <= 0:
                continue
            h = plot_h * cost / peak
            y -= h
            label = html.escape(
                f"{LAYER_NAMES.get(layer, layer)}: {_money(cost)} {bill.currency}, {in_words(first, last)}"
            )
            parts.append(
                f'<rect x="{x:.2f}" y="{y:.2f}" width="{max(bar_w - 1, 0.5):.2f}" height="{h:.2f}" '
                f'fill="{_colour(layer, layers)}" data-layer="{html.escape(layer)}"><title>{label}</title></rect>'
            )
    if bars:
        for moment, label in time_ticks(bill.start, bill.end):
            x = left + plot_w * (moment - bill.start) / (bill.end - bill.start)
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 5}" stroke="#888"/>')
            parts.append(
                f'<text class="time-tick" x="{x:.1f}" y="{height - 18}" text-anchor="middle" '
                f'data-time="{iso(moment)}">{html.escape(label)}</text>'
            )
        parts.append(
            f'<text class="axis-title" id="x-unit" x="{left + plot_w / 2:.1f}" y="{height + 12}" '
            f'text-anchor="middle">time (UTC); each bar is the {_duration(bar_seconds)} before its right edge</text>'
        )
    parts.append(f'<path d="M{left},{top} V{top + plot_h} H{width - 10}" stroke="#888" fill="none"/>')
    parts.append("</svg>")
    legend = _legend(
        "timeline-legend",
        [(_colour(layer, layers), LAYER_NAMES.get(layer, layer), layer) for layer in layers],
    )
    return "\n".join(parts) + "\n" + legend


def _comparison_svg(bill: Bill, shown: Statement) -> str:
    rows = [row for row in shown.groups if row.values["total_cost"] or row.values["request_cost"]][:15]
    if not rows:
        return "<p>No group used or requested a GPU in this range.</p>"
    row_h, left, width = 34, 200, 960
    height = row_h * len(rows) + 40
    peak = float(max(max(row.amount("total_cost"), row.amount("request_cost")) for row in rows))
    peak = peak or 1.0
    scale = (width - left - 120) / peak
    parts = [
        f'<svg id="comparison" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="request-based versus billed cost per group">',
        "<title>Request-based versus billed cost per group</title>",
    ]
    for index, row in enumerate(rows):
        y = 10 + index * row_h
        name = html.escape(row.name)
        parts.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{name}</text>')
        bars = (
            (0, row.amount("request_cost"), REQUEST_COLOUR, "request"),
            (13, row.amount("total_cost"), BILLED_COLOUR, "billed"),
        )
        for offset, value, colour, kind in bars:
            length = float(value) * scale
            parts.append(
                f'<rect x="{left}" y="{y + offset}" width="{max(length, 0.5):.2f}" height="11" fill="{colour}" '
                f'data-kind="{kind}" data-group="{name}"><title>{name} {kind}: {_money(value)}</title></rect>'
            )
            parts.append(f'<text x="{left + length + 6:.2f}" y="{y + offset + 10}">{_money(value)}</text>')
    parts.append(
        f'<text class="axis-title" id="comparison-unit" x="{left}" y="{height - 8}">'
        f"cost over the whole range, {html.escape(bill.currency)}</text>"
    )
    parts.append("</svg>")
    legend = _legend(
        "comparison-legend",
        [
            (REQUEST_COLOUR, "by request: GPU-h held × price (what tools that bill allocations charge)", "request"),
            (BILLED_COLOUR, "billed here: the group's total", "billed"),
        ],
    )
    return "\n".join(parts) + "\n" + legend


# --- the other sections -------------------------------------------------------------------------------------------


def _headline(bill: Bill, shown: Statement) -> str:
    values = {kind: shown.row(kind).values for kind in RowKind if kind is not RowKind.GROUP}
    currency = html.escape(bill.currency)

    def card(key: str, label: str, value: object, extra: str = "") -> str:
        return f'<div class="card{extra}" data-key="{key}">{html.escape(label)}<b>{_money(value)} {currency}</b></div>'  # type: ignore[arg-type]

    cards = [
        card("total", "GPU cost of the range", values[RowKind.TOTAL]["total_cost"], " headline"),
        '<div class="card op">=</div>',
        card("groups", "billed to groups", values[RowKind.SUBTOTAL]["total_cost"]),
        '<div class="card op">+</div>',
        card(RowKind.UNATTRIBUTED.value, RowKind.UNATTRIBUTED.value, values[RowKind.UNATTRIBUTED]["total_cost"]),
        '<div class="card op">+</div>',
        card("platform", "platform idle", values[RowKind.PLATFORM]["total_cost"]),
    ]
    subtotal = values[RowKind.SUBTOTAL]
    within = [
        f"{title} {_money(subtotal[key])}"  # type: ignore[arg-type]
        for key, title in (("reserved_cost", "held, unused"), ("overreach_cost", "used without allocation"))
        if subtotal[key]
    ]
    said = f'<p class="within" id="within">Within the groups: {html.escape("; ".join(within))}.</p>' if within else ""
    return f'<div class="cards">{"".join(cards)}</div>{said}'


def _overreach_table(bill: Bill, shown: Statement) -> str:
    if not shown.overreach:
        return '<p id="no-overreach">No container used GPU memory on a GPU it was not allocated.</p>'
    columns = (
        ("namespace", "namespace"),
        ("pod", "pod"),
        ("container", "container"),
        ("node", "node"),
        ("gpu", "GPU"),
        ("group", "charged to"),
        ("gib_hours", "memory GiB-h"),
        ("cost", "cost"),
    )
    records = [
        {
            "namespace": line.item.owner.namespace,
            "pod": line.item.owner.pod,
            "container": line.item.owner.container,
            "node": line.item.node,
            "gpu": line.item.gpu_uuid,
            "group": line.item.owner.group,
            "gib_hours": line.gib_hours,
            "cost": line.cost,
        }
        for line in shown.overreach
    ]
    caption = (
        f"Containers that held memory on a GPU or MIG slice they were not allocated, {bill.currency}; each cost is "
        "in its group's 'used without allocation' column"
    )
    return _simple_table("overreach", caption, columns, records, text=[key for key, _ in columns[:6]])


def _device_metrics_section(bill: Bill) -> str:
    """With --compare-device-metrics: what dcgm-exporter's per-pod series would bill, beside this bill."""
    if bill.comparison is None:
        return ""
    lines = comparison_lines(bill)
    table = _simple_table(
        "device-metrics",
        f"This bill beside two device-metric methods, {bill.currency} (not billed)",
        COMPARISON_COLUMNS,
        comparison_rows(bill),
        text=("group",),
    )
    paragraphs = "".join(f'<p class="note">{html.escape(line)}</p>' for line in lines)
    return f"""<h2>Device metrics against this bill</h2>
<p>What a bill made from dcgm-exporter's per-pod series would charge for the same range and prices. On a shared
GPU such series carry the device's value for a pod, or one copy per pod that shares it, so their bill does not add up
to what the cards cost (docs/chargeback.md, Device metrics against this bill).</p>
{table}
{paragraphs}
"""


def method_paragraph(bill: Bill) -> str:
    idle = (
        "Idle capacity is charged to the platform row."
        if bill.idle_policy is IdlePolicy.PLATFORM
        else "Idle capacity is shared out over the parties billed on that card in this range, in proportion to what "
        "they were billed on it; a card nobody was billed on goes to the platform row."
    )
    if bill.method is Method.HOLDER:
        held = (
            "What an allocation blocks, its holder pays: a container that holds a GPU or slice (or replicas of a "
            "shared GPU) with none of its memory on it pays its share of that device (ids held ÷ replicas the "
            "device plugin offers), shown as held, unused. The rest of each device is split among the "
            "containers that held memory on it, in proportion to the memory they held (measured per process by "
            "the driver). Idle capacity is what nobody held and nobody used, and MIG capacity outside any slice."
        )
    else:
        held = (
            "The cost of a GPU or slice is split among the containers that held memory on it, in proportion to the "
            "memory they held (measured per process by the driver); a device with no memory in use is idle, even "
            "when it is allocated (method usage)."
        )
    return (
        "Every GPU costs its hourly price for every hour it exists; a MIG slice costs its share of its card. "
        f"{held} {idle} Memory of processes outside any container is the unattributed row. Memory a container "
        "held on a GPU it was not allocated is overreach: priced the same way and charged to the group of the "
        "container that used it, in a column of its own, so that every amount of the range is in a row. The "
        "request-based column is what tools that bill allocations charge: GPU-hours held × price. Amounts are "
        "rounded to the cent so that they add up: the rows share the rounded total by the largest remainder "
        "method. Compute utilisation is an operational signal and is not billed."
    )


METHOD_WORDS = {Method.HOLDER: "holders pay what they hold", Method.USAGE: "memory alone"}
IDLE_WORDS = {
    IdlePolicy.PROPORTIONAL: "shared out over each card's users",
    IdlePolicy.PLATFORM: "charged to the platform row",
}


def _provenance_table(bill: Bill, made: Provenance) -> str:
    facts = [
        ("range", f"{in_words(bill.start, bill.end)} ({iso(bill.start)} .. {iso(bill.end)})"),
        ("resolution", f"{made.step:g} s ({_duration(made.step)})"),
        ("split from", made.split_from),
        ("method", f"{bill.method.value}: {METHOD_WORDS[bill.method]}"),
        ("idle capacity", f"{bill.idle_policy.value}: {IDLE_WORDS[bill.idle_policy]}"),
        ("grouped by", made.group_by),
        ("currency", bill.currency),
        ("source", made.source),
        ("generated", f"{iso(made.generated_at)} by gpu-fence {made.version}"),
    ]
    if made.cost_centres.given:
        facts.append(("cost centres", made.cost_centres.file))
    records = [{"fact": name, "value": value} for name, value in facts]
    columns = (("fact", "fact"), ("value", "value"))
    return _simple_table("provenance", "How this bill was made", columns, records, text=("fact", "value"))


PRICE_TABLE = (("model", "GPU model"), ("price_per_gpu_hour", "price per GPU-hour"), ("cards", "cards"),
               ("priced_by", "priced by"))  # fmt: skip


def render_html(bill: Bill, made: Provenance) -> str:
    shown = statement(bill, made.cost_centres)
    notes = "".join(f'<p class="note">Note: {html.escape(note)}</p>' for note in bill.notes)
    when = in_words(bill.start, bill.end)
    title = f"GPU bill, {when}"
    by = made.group_by
    prices = _simple_table(
        "prices",
        f"Prices as applied, {bill.currency} per GPU-hour of a whole card (a MIG slice costs its share)",
        PRICE_TABLE,
        price_rows(made),
        text=("model", "priced_by"),
    )
    per_card = _simple_table(
        "cards",
        f"Every card over the range, {bill.currency}",
        CARD_COLUMNS,
        card_rows(shown),
        text=("node", "gpu_uuid", "model"),
    )
    centres = ""
    if shown.centres:
        table = _simple_table(
            "cost-centres",
            f"GPU cost per cost centre, {bill.currency}: the rows of the table above, summed per cost centre",
            CENTRE_COLUMNS,
            centre_rows(shown),
            text=("cost_centre", "rows"),
        )
        centres = f"<h2>Cost per cost centre</h2>\n{table}\n"
    idle_said = (
        "idle capacity shared out over each card's users"
        if bill.idle_policy is IdlePolicy.PROPORTIONAL
        else "idle capacity charged to the platform"
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="meta">Per {html.escape(by)} · amounts in {html.escape(bill.currency)} · {bill.gpu_hours:,.1f} card-hours ·
method {html.escape(bill.method.value)}, {idle_said} · generated {iso(made.generated_at)} by gpu-fence
{html.escape(made.version)}</p>
{_headline(bill, shown)}
{notes}
<h2>Cost per group</h2>
{_groups_table(bill, shown, by)}
{_glossary(bill, shown, by)}
{centres}<h2>Cost over time</h2>
<p>What each interval's GPU cost went to, stacked: the groups' use and held capacity, use without an allocation,
unattributed memory and idle capacity.</p>
{_timeline_svg(bill, made.step)}
<h2>Request-based versus billed</h2>
<p>Request-based tools bill the GPUs a pod was allocated for as long as it held them. This bill splits what the
GPUs cost by the memory each group held, and charges holders for what they held without using. A shared
(time-sliced) GPU is billed once per replica by requests, once in total here.</p>
{_comparison_svg(bill, shown)}
{_device_metrics_section(bill)}<h2>Used without an allocation</h2>
{_overreach_table(bill, shown)}
<h2>How this was computed</h2>
<p id="method">{html.escape(method_paragraph(bill))}</p>
{_provenance_table(bill, made)}
{prices}
{per_card}
</body>
</html>
"""
