"""A self-contained HTML bill: one file with inline CSS and inline SVG charts, nothing loaded from anywhere.

Written for someone who has never used Prometheus: totals first, then what the money went to over time, how it
compares with what request-based tools would charge, who used GPUs they were not given, and how it was computed.
"""

from __future__ import annotations

import html
from collections import defaultdict

from .compute import IDLE, OVERREACH, UNATTRIBUTED, Bill, Method, TimePoint
from .provenance import Provenance
from .render import (
    CARD_COLUMNS,
    COLUMNS,
    COMPARISON_COLUMNS,
    PRICE_COLUMNS,
    Columns,
    card_rows,
    comparison_lines,
    comparison_rows,
    price_rows,
    rows,
)
from .times import iso

MAX_BARS = 96
MAX_LAYER_GROUPS = 8
OTHER = "other groups"
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
FIXED_COLOURS = {OTHER: "#c7c7c7", OVERREACH: "#d62728", UNATTRIBUTED: "#ff7f0e", IDLE: "#e8e8e8"}

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #222; line-height: 1.45; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
.meta { color: #555; }
.cards { display: flex; gap: 1rem; flex-wrap: wrap; margin: 1rem 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: .6rem 1rem; min-width: 10rem; }
.card b { display: block; font-size: 1.3rem; }
table { border-collapse: collapse; margin: .5rem 0; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #e4e4e4; padding: .3rem .6rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tbody th { font-weight: normal; }
caption { caption-side: top; text-align: left; color: #555; padding-bottom: .3rem; }
tr.total td, tr.total th { font-weight: bold; border-top: 2px solid #999; }
tr.special th { font-style: italic; }
svg { max-width: 100%; height: auto; }
.legend span { display: inline-block; margin-right: 1rem; }
.legend i { display: inline-block; width: .8rem; height: .8rem; margin-right: .3rem; vertical-align: -1px; }
.neg { color: #1a7f37; } .pos { color: #b42318; }
svg text { font-size: 11px; fill: #444; }
svg text.axis-title { font-size: 12px; fill: #222; }
.note { color: #8a5a00; }
#provenance td, #prices th, #prices td:nth-child(2) { text-align: left; }
"""


def _money(value: float) -> str:
    return f"{value + 0.0:,.2f}"


def _layers(bill: Bill) -> list[str]:
    top = [group.group for group in bill.groups if group.usage > 0][:MAX_LAYER_GROUPS]
    layers = list(top)
    if any(group.usage > 0 for group in bill.groups[MAX_LAYER_GROUPS:]) or len(
        [group for group in bill.groups if group.usage > 0]
    ) > len(top):
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


TIME_TICKS = (0.25, 0.5, 0.75)  # labelled instants between the range's start and end


def _timeline_svg(bill: Bill, step: float) -> str:
    layers = _layers(bill)
    bars = _buckets(bill.timeline, layers)
    width, height, left, bottom, top = 960, 300, 70, 40, 10
    plot_w, plot_h = width - left - 10, height - bottom - top
    peak = max((sum(costs.values()) for _, _, costs in bars), default=0.0) or 1.0
    bar_w = plot_w / max(1, len(bars))
    bar_seconds = (bars[0][1] - bars[0][0]) if bars else step
    parts = [
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20}" '
        f'viewBox="0 0 {width} {height + 20}" role="img" aria-label="GPU cost over time, stacked by group">',
        f"<title>GPU cost over time, stacked by group, {iso(bill.start)} to {iso(bill.end)}</title>",
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = top + plot_h * (1 - fraction)
        parts.append(f'<line x1="{left}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_money(peak * fraction)}</text>')
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
            label = html.escape(f"{layer}: {_money(cost)} {bill.currency}, {iso(first)} .. {iso(last)}")
            parts.append(
                f'<rect x="{x:.2f}" y="{y:.2f}" width="{max(bar_w - 1, 0.5):.2f}" height="{h:.2f}" '
                f'fill="{_colour(layer, layers)}" data-layer="{html.escape(layer)}"><title>{label}</title></rect>'
            )
    if bars:
        for anchor, moment, x in (("start", bill.start, left), ("end", bill.end, width - 10)):
            parts.append(f'<text x="{x}" y="{height - 12}" text-anchor="{anchor}">{iso(moment)}</text>')
        for fraction in TIME_TICKS:
            moment = bill.start + (bill.end - bill.start) * fraction
            x = left + plot_w * fraction
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 5}" stroke="#888"/>')
            parts.append(
                f'<text class="time-tick" x="{x:.1f}" y="{height - 12}" text-anchor="middle">{iso(moment)}</text>'
            )
        parts.append(
            f'<text class="axis-title" id="x-unit" x="{left + plot_w / 2:.1f}" y="{height + 12}" '
            f'text-anchor="middle">time (UTC); each bar is the {_duration(bar_seconds)} before its right edge</text>'
        )
    parts.append(f'<path d="M{left},{top} V{top + plot_h} H{width - 10}" stroke="#888" fill="none"/>')
    parts.append("</svg>")
    legend = "".join(
        f'<span><i style="background:{_colour(layer, layers)}"></i>{html.escape(layer)}</span>' for layer in layers
    )
    return "\n".join(parts) + f'\n<div class="legend" id="timeline-legend">{legend}</div>'


def _comparison_svg(bill: Bill) -> str:
    groups = [group for group in bill.groups if group.total > 0 or group.request > 0][:15]
    if not groups:
        return "<p>No group used or requested a GPU in this range.</p>"
    row_h, left, width = 34, 200, 960
    height = row_h * len(groups) + 40
    peak = max(max(group.total, group.request) for group in groups) or 1.0
    scale = (width - left - 120) / peak
    parts = [
        f'<svg id="comparison" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="request-based versus billed cost per group">',
        "<title>Request-based versus billed cost per group</title>",
    ]
    for index, group in enumerate(groups):
        y = 10 + index * row_h
        name = html.escape(group.group)
        parts.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{name}</text>')
        bars = ((0, group.request, "#9e9e9e", "request"), (13, group.total, "#1f77b4", "billed"))
        for offset, value, colour, kind in bars:
            parts.append(
                f'<rect x="{left}" y="{y + offset}" width="{max(value * scale, 0.5):.2f}" height="11" fill="{colour}" '
                f'data-kind="{kind}" data-group="{name}"><title>{name} {kind}: {_money(value)}</title></rect>'
            )
            parts.append(f'<text x="{left + value * scale + 6:.2f}" y="{y + offset + 10}">{_money(value)}</text>')
    parts.append(
        f'<text class="axis-title" id="comparison-unit" x="{left}" y="{height - 8}">'
        f"cost over the whole range, {html.escape(bill.currency)}</text>"
    )
    parts.append("</svg>")
    legend = (
        '<div class="legend" id="comparison-legend"><span><i style="background:#9e9e9e"></i>request-based '
        "(allocated GPUs × hours × price)</span>"
        '<span><i style="background:#1f77b4"></i>billed here (the group\'s total)</span></div>'
    )
    return "\n".join(parts) + "\n" + legend


def _groups_table(bill: Bill, by: str) -> str:
    head = "".join(f'<th scope="col">{html.escape(title)}</th>' for _, title in COLUMNS)
    body = []
    for row in rows(bill):
        cells = []
        for key, _ in COLUMNS:
            value = row.values.get(key)
            if value is None:
                text, css = "–", ""
            elif isinstance(value, str):
                text, css = html.escape(value), ""
            else:
                text = _money(value)
                css = ' class="neg"' if key == "difference" and value < -0.005 else ""
                css = ' class="pos"' if key == "difference" and value > 0.005 else css
            cell = '<th scope="row"' if key == "group" else "<td"
            cells.append(f'{cell} data-key="{key}"{css}>{text}</{cell[1:3]}>')
        kind = {"group": "group", "total": "total"}.get(row.kind, "special")
        body.append(f'<tr class="{kind}" data-kind="{row.kind}">{"".join(cells)}</tr>')
    caption = (
        f"GPU cost per {html.escape(by)} in {html.escape(bill.currency)}; overreach is listed apart and is not part "
        "of the total"
    )
    return (
        f'<table id="groups"><caption>{caption}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


SIGNS_LEGEND = (
    '<div class="legend" id="signs-legend">'
    '<span><b class="neg">−1.00</b> total − request below zero: requests overstate what the group is billed '
    "(a shared card billed once per replica by requests)</span>"
    '<span><b class="pos">+1.00</b> above zero: billed more than it requested (an idle share of a card it '
    "used, under --idle proportional)</span>"
    "<span><b>–</b> does not apply to that row</span>"
    "<span><em>(italic rows)</em> are not groups: unattributed memory and the platform's idle capacity</span>"
    "</div>"
)


def _simple_table(table_id: str, caption: str, columns: Columns, records: list[dict]) -> str:
    """A table whose first column heads each row; numbers as money unless the column counts cards or hours."""
    head = "".join(f'<th scope="col">{html.escape(title)}</th>' for _, title in columns)
    body = []
    for record in records:
        cells = []
        for index, (key, _) in enumerate(columns):
            value = record.get(key)
            if isinstance(value, str):
                text = html.escape(value)
            elif key == "cards":
                text = f"{value:g}"
            elif key == "hours":
                text = f"{value:,.2f}"
            else:
                text = _money(value)
            tag = 'th scope="row"' if index == 0 else "td"
            cells.append(f'<{tag} data-key="{key}">{text}</{tag[:2]}>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (
        f'<table id="{table_id}"><caption>{html.escape(caption)}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _provenance_table(bill: Bill, made: Provenance) -> str:
    facts = [
        ("generated", f"{iso(made.generated_at)} by gpu-fence {made.version}"),
        ("source", made.source),
        ("range", f"{iso(bill.start)} .. {iso(bill.end)}"),
        ("step", f"{made.step:g} s ({_duration(made.step)})"),
        ("split from", made.series.described),
        ("method", bill.method.value),
        ("idle capacity", bill.idle_policy.value),
        ("grouped by", made.group_by),
        ("currency", bill.currency),
    ]
    records = [{"fact": name, "value": value} for name, value in facts]
    return _simple_table("provenance", "How this bill was made", (("fact", "fact"), ("value", "value")), records)


def _overreach_table(bill: Bill) -> str:
    if not bill.overreach:
        return '<p id="no-overreach">No container used GPU memory on a GPU it was not allocated.</p>'
    lines = [
        f'<table id="overreach"><caption>Containers that held memory on a GPU or MIG slice they were not '
        f"allocated, cost in {html.escape(bill.currency)}</caption><thead><tr>"
        + "".join(
            f'<th scope="col">{title}</th>'
            for title in ("namespace", "pod", "container", "node", "GPU", "memory GiB-h", "cost")
        )
        + "</tr></thead><tbody>"
    ]
    for item in bill.overreach:
        cells = (item.owner.pod, item.owner.container, item.node, item.gpu_uuid)
        lines.append(
            f'<tr><th scope="row">{html.escape(item.owner.namespace)}</th>'
            + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells)
            + f'<td>{item.gib_hours:,.1f}</td><td data-key="cost">{_money(item.cost)}</td></tr>'
        )
    lines.append("</tbody></table>")
    return "".join(lines)


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
        if bill.idle_policy.value == "platform"
        else "Idle capacity is spread over the parties billed on that card in this range, in proportion to what "
        "they were billed on it; a card nobody was billed on goes to the platform row."
    )
    if bill.method is Method.HOLDER:
        held = (
            "What an allocation blocks, its holder pays: a container that holds a GPU or slice (or replicas of a "
            "shared GPU) with none of its memory on it pays its share of that device (ids held ÷ replicas the "
            "device plugin offers), shown as reserved, unused. The rest of each device is split among the "
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
        "held on a GPU it was not allocated is overreach: priced the same way, listed apart, and never added to "
        "anyone's total. The request-based column is what tools that bill allocations charge: allocated GPUs × "
        "hours × price. Compute utilisation is an operational signal and is not billed: the SM-active GPU-hours "
        "column shows it beside the cost (unknown, –, where the auditor does not sample it, as on MIG)."
    )


def render_html(bill: Bill, made: Provenance) -> str:
    billed = sum(group.total for group in bill.groups)
    overreach = sum(group.overreach for group in bill.groups)
    cards = [
        ("GPU cost of the range", bill.total_gpu_cost),
        ("billed to groups", billed),
        ("of which reserved, unused", sum(group.reserved for group in bill.groups)),
        ("overreach (apart)", overreach),
        ("unattributed", bill.unattributed),
        ("platform idle", bill.platform),
    ]
    card_html = "".join(
        f'<div class="card" data-key="{html.escape(label)}">{html.escape(label)}<b>{_money(value)} '
        f"{html.escape(bill.currency)}</b></div>"
        for label, value in cards
    )
    notes = "".join(f'<p class="note">Note: {html.escape(note)}</p>' for note in bill.notes)
    title = f"GPU chargeback {iso(bill.start)} – {iso(bill.end)}"
    by = made.group_by
    prices = _simple_table(
        "prices", f"Prices as applied, {bill.currency} per card-hour", PRICE_COLUMNS, price_rows(made)
    )
    per_card = _simple_table("cards", f"Every card over the range, {bill.currency}", CARD_COLUMNS, card_rows(bill))
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
<p class="meta">Grouped by {html.escape(by)} · method {html.escape(bill.method.value)} · idle capacity:
{html.escape(bill.idle_policy.value)} · resolution {made.step:g} s · {bill.gpu_hours:,.1f} card-hours · amounts in
{html.escape(bill.currency)} · generated {iso(made.generated_at)} by gpu-fence {html.escape(made.version)}</p>
<div class="cards">{card_html}</div>
{notes}
<h2>Cost per group</h2>
{_groups_table(bill, by)}
{SIGNS_LEGEND}
<p>The unattributed row is GPU memory of processes outside any known container (for example host processes).
The platform row is idle capacity nobody was charged for.</p>
<h2>Cost over time</h2>
<p>What each interval's GPU cost went to, stacked: groups (memory share and reservations), overreach, unattributed
memory and idle capacity.</p>
{_timeline_svg(bill, made.step)}
<h2>Request-based versus billed</h2>
<p>Request-based tools bill the GPUs a pod was allocated for as long as it held them. This bill splits what the
GPUs cost by the memory each group held, and charges holders for what they held without using. A shared
(time-sliced) GPU is billed once per replica by requests, once in total here.</p>
{_comparison_svg(bill)}
{_device_metrics_section(bill)}<h2>Overreach: GPU use without an allocation</h2>
{_overreach_table(bill)}
<h2>How this was computed</h2>
<p id="method">{html.escape(method_paragraph(bill))}</p>
{_provenance_table(bill, made)}
{prices}
{per_card}
</body>
</html>
"""
