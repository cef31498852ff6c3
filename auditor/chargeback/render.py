"""A :class:`Bill` as text: an aligned table for people, CSV and JSON for tools, markdown for tickets and wikis.

All four show the same rows: one per group, then ``(unattributed)`` (memory of processes outside any container),
``(platform)`` (idle capacity nobody is charged for), and ``TOTAL``. Overreach is a column of its own that is
not part of a group's total; the footer states that billed total + overreach = the GPU cost of the range. Each
also says how it was made (:class:`~.provenance.Provenance`): the price list as applied and every card's cost.
The JSON follows ``bill.schema.json`` beside this module.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .compute import PLATFORM, UNATTRIBUTED, Bill
from .devicemetrics import DeviceMetricBill
from .provenance import Provenance
from .times import iso

COLUMNS = (
    ("group", "group"),
    ("requested_gpu_hours", "requested GPU-h"),
    ("request_cost", "request cost"),
    ("memory_gib_hours", "memory GiB-h"),
    ("usage_cost", "usage cost"),
    ("reserved_cost", "reserved, unused"),
    ("idle_cost", "idle share"),
    ("total_cost", "total"),
    ("difference", "total - request"),
    ("overreach_cost", "overreach (apart)"),
    ("sm_active_gpu_hours", "SM-active GPU-h (not billed)"),
)
MONEY = {"request_cost", "usage_cost", "reserved_cost", "idle_cost", "total_cost", "difference", "overreach_cost"}
CARD_COLUMNS = (
    ("node", "node"),
    ("gpu_uuid", "GPU"),
    ("model", "model"),
    ("price_per_gpu_hour", "price/h"),
    ("hours", "hours"),
    ("cost", "cost"),
    ("unused_cost", "unheld, unused"),
)
PRICE_COLUMNS = (
    ("rule", "price list entry"),
    ("model", "model"),
    ("price_per_gpu_hour", "price/h"),
    ("cards", "cards"),
)
COMPARISON_COLUMNS = (
    ("group", "group"),
    ("gpu_fence_cost", "this bill"),
    ("device_hours_cost", "device-hours"),
    ("utilisation_cost", "utilisation"),
)
OTHER = "(unattributed, platform, overreach)"
SCHEMA = "bill.schema.json"


@dataclass(frozen=True)
class Row:
    kind: str  # group | unattributed | platform | total
    values: dict[str, float | str | None]


def rows(bill: Bill) -> list[Row]:
    result = []
    for group in bill.groups:
        result.append(
            Row(
                "group",
                {
                    "group": group.group,
                    "requested_gpu_hours": group.requested_gpu_hours,
                    "request_cost": group.request,
                    "memory_gib_hours": group.memory_gib_hours,
                    "usage_cost": group.usage,
                    "reserved_cost": group.reserved,
                    "idle_cost": group.idle,
                    "total_cost": group.total,
                    "difference": group.difference,
                    "overreach_cost": group.overreach,
                    "sm_active_gpu_hours": group.sm_active_gpu_hours,
                },
            )
        )
    empty = dict.fromkeys(key for key, _ in COLUMNS if key != "group")
    unattributed = dict(
        empty,
        group=UNATTRIBUTED,
        memory_gib_hours=bill.unattributed_gib_hours,
        usage_cost=bill.unattributed,
        total_cost=bill.unattributed,
    )
    platform = dict(empty, group=PLATFORM, idle_cost=bill.platform, total_cost=bill.platform)
    result.append(Row("unattributed", unattributed))
    result.append(Row("platform", platform))
    totals: dict[str, float | str | None] = {"group": "TOTAL"}
    for key, _ in COLUMNS[1:]:
        known = [float(row.values[key]) for row in result if row.values[key] is not None]
        totals[key] = sum(known) if known or key != "sm_active_gpu_hours" else None  # unknown everywhere: unknown
    result.append(Row("total", totals))
    return result


def card_rows(bill: Bill) -> list[dict[str, float | str]]:
    return [
        {
            "node": card.node,
            "gpu_uuid": card.uuid,
            "model": card.model,
            "price_per_gpu_hour": card.price_per_hour,
            "hours": card.hours,
            "cost": card.cost,
            "unused_cost": card.unused,
        }
        for card in bill.cards
    ]


def price_rows(made: Provenance) -> list[dict[str, float | str]]:
    return [
        {"rule": item.rule, "model": item.model, "price_per_gpu_hour": item.price, "cards": item.cards}
        for item in made.prices
    ]


def comparison_rows(bill: Bill) -> list[dict[str, float | str]]:
    """With --compare-device-metrics: a row per group, this bill's other rows as one, and the total."""
    found = bill.comparison
    if found is None:
        return []
    records: list[dict[str, float | str]] = [
        {
            "group": group.group,
            "gpu_fence_cost": group.gpu_fence,
            "device_hours_cost": group.device_hours,
            "utilisation_cost": group.utilisation,
        }
        for group in found.groups
    ]
    records.append(
        {"group": OTHER, "gpu_fence_cost": found.gpu_fence_rest, "device_hours_cost": 0.0, "utilisation_cost": 0.0}
    )
    records.append(
        {
            "group": "TOTAL",
            "gpu_fence_cost": found.gpu_fence_total,
            "device_hours_cost": found.device_hours_total,
            "utilisation_cost": found.utilisation_total,
        }
    )
    return records


def comparison_lines(bill: Bill) -> list[str]:
    """What the comparison's totals come to against what the cards cost, and its notes."""
    found = bill.comparison
    if found is None:
        return []

    def times(value: float) -> str:
        return f"{value / found.real_cost:.2f}x" if found.real_cost > 0 else "-"

    return [
        f"the cards cost {found.real_cost:,.2f} {bill.currency}: this bill adds up to {times(found.gpu_fence_total)} "
        f"that, device-hours to {times(found.device_hours_total)}, utilisation to {times(found.utilisation_total)}",
        "device-hours: each pod a device's DCGM_FI_DEV_FB_USED series names pays the device for the interval; "
        "utilisation: the device x DCGM_FI_DEV_GPU_UTIL / 100 of that series. Neither is how this bill is made.",
        *(f"note: {note}" for note in found.notes),
    ]


def _cell(key: str, value: float | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if key == "cards":
        return f"{value:d}" if isinstance(value, int) else f"{value:g}"
    return f"{value + 0.0:,.2f}"  # + 0.0 turns -0.0 into 0.0, so a zero difference never prints as "-0.00"


def provenance_lines(bill: Bill, made: Provenance) -> list[str]:
    """The facts every format states, as ``label: value`` pairs in one order."""
    return [
        f"range: {iso(bill.start)} .. {iso(bill.end)}, step {made.step:g} s, split from {made.series.described}",
        f"method: {bill.method.value}, idle: {bill.idle_policy.value}, grouped by {made.group_by}",
        f"currency: {bill.currency}",
        f"source: {made.source}",
        f"generated: {iso(made.generated_at)} by gpu-fence {made.version}",
    ]


def _header(bill: Bill, made: Provenance) -> str:
    return f"GPU chargeback {iso(bill.start)} .. {iso(bill.end)}, by {made.group_by}"


def _footer(bill: Bill) -> list[str]:
    billed = sum(group.total for group in bill.groups) + bill.unattributed + bill.platform
    overreach = sum(group.overreach for group in bill.groups)
    lines = [
        f"GPU cost of the range: {bill.total_gpu_cost:,.2f} {bill.currency} over {bill.gpu_hours:,.1f} card-hours "
        f"= billed {billed:,.2f} + overreach {overreach:,.2f}",
    ]
    lines += [f"note: {note}" for note in bill.notes]
    return lines


Columns = tuple[tuple[str, str], ...]


def _aligned(columns: Columns, records: list[dict[str, Any]], total_last: bool = False) -> list[str]:
    table = [[title for _, title in columns]]
    table += [[_cell(key, record.get(key)) for key, _ in columns] for record in records]
    widths = [max(len(line[index]) for line in table) for index in range(len(columns))]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        return "  ".join(padded).rstrip()

    rule = line(["-" * w for w in widths])
    body = [line(cells) for cells in table[1:]]
    if total_last:
        body = [*body[:-1], rule, body[-1]]
    return [line(table[0]), rule, *body]


def render_table(bill: Bill, made: Provenance) -> str:
    out = [_header(bill, made), *provenance_lines(bill, made), ""]
    out += _aligned(COLUMNS, [row.values for row in rows(bill)], total_last=True)
    out.append("")
    if bill.overreach:
        out.append("Overreach (GPU memory without an allocation; not in any group's total):")
        for item in bill.overreach:
            out.append(
                f"  {item.owner.namespace}/{item.owner.pod}/{item.owner.container} on {item.node} {item.gpu_uuid}: "
                f"{item.gib_hours:,.1f} GiB-h, {item.cost:,.2f}"
            )
        out.append("")
    if bill.comparison is not None:
        out.append("Device metrics (dcgm-exporter's per-pod series) against this bill, not billed:")
        out += _aligned(COMPARISON_COLUMNS, comparison_rows(bill), total_last=True)
        out += [*comparison_lines(bill), ""]
    out += ["Prices as applied (per card-hour):", *_aligned(PRICE_COLUMNS, price_rows(made)), ""]
    out += ["Cards:", *_aligned(CARD_COLUMNS, card_rows(bill)), ""]
    out += _footer(bill)
    return "\n".join(out) + "\n"


def _markdown_table(columns: Columns, records: list[dict[str, Any]]) -> list[str]:
    out = ["| " + " | ".join(title for _, title in columns) + " |"]
    out.append("|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|")
    for record in records:
        cells = [_cell(key, record.get(key)).replace("|", "\\|") for key, _ in columns]
        out.append("| " + " | ".join(cells) + " |")
    return out


def render_markdown(bill: Bill, made: Provenance) -> str:
    out = [f"## {_header(bill, made)}", ""]
    out += [f"- {line}" for line in provenance_lines(bill, made)]
    out.append("")
    out.append("| " + " | ".join(title for _, title in COLUMNS) + " |")
    out.append("|" + "|".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + "|")
    for row in rows(bill):
        cells = [_cell(key, row.values.get(key)) for key, _ in COLUMNS]
        if row.kind == "total":
            cells = [f"**{cell}**" for cell in cells]
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    out.append("")
    if bill.overreach:
        out += [
            "### Overreach (not in any group's total)",
            "",
            "| namespace | pod | container | node | GPU | GiB-h | cost |",
            "|---|---|---|---|---|---:|---:|",
        ]
        for item in bill.overreach:
            out.append(
                f"| {item.owner.namespace} | {item.owner.pod} | {item.owner.container} | {item.node} | "
                f"{item.gpu_uuid} | {item.gib_hours:,.1f} | {item.cost:,.2f} |"
            )
        out.append("")
    if bill.comparison is not None:
        out += ["### Device metrics (dcgm-exporter's per-pod series) against this bill, not billed", ""]
        out += [*_markdown_table(COMPARISON_COLUMNS, comparison_rows(bill)), ""]
        out += [*(f"{line}  " for line in comparison_lines(bill)), ""]
    out += ["### Prices as applied (per card-hour)", "", *_markdown_table(PRICE_COLUMNS, price_rows(made)), ""]
    out += ["### Cards", "", *_markdown_table(CARD_COLUMNS, card_rows(bill)), ""]
    out += [f"{line}  " for line in _footer(bill)]
    return "\n".join(out) + "\n"


# CSV is one table: bill rows, then a row per price list entry (kind "price") and per card (kind "card"), with
# the columns of all three; how the bill was made repeats on every row so that any row can stand alone.
CSV_EXTRA = (
    "node",
    "gpu_uuid",
    "model",
    "price_rule",
    "price_per_gpu_hour",
    "cards",
    "card_hours",
    "card_cost",
    "unused_cost",
)
CSV_MADE = (
    "currency",
    "start",
    "end",
    "step_seconds",
    "method",
    "idle_policy",
    "group_by",
    "source",
    "generated_at",
    "gpu_fence_version",
    "series",
)


# With --compare-device-metrics: rows of kind "device-metrics" (and "device-metrics-total") in these columns.
CSV_COMPARISON = ("gpu_fence_cost", "device_hours_cost", "utilisation_cost", "real_cost")


def render_csv(bill: Bill, made: Provenance) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    body = [*(key for key, _ in COLUMNS), *CSV_EXTRA, *(CSV_COMPARISON if bill.comparison is not None else ())]
    writer.writerow(["kind", *body, *CSV_MADE])
    made_values = [
        bill.currency,
        iso(bill.start),
        iso(bill.end),
        f"{made.step:g}",
        bill.method.value,
        bill.idle_policy.value,
        made.group_by,
        made.source,
        iso(made.generated_at),
        made.version,
        made.series.value,
    ]

    def write(kind: str, record: dict[str, Any]) -> None:
        cells = ("" if record.get(key) is None else _csv_number(record[key]) for key in body)
        writer.writerow([kind, *cells, *made_values])

    for row in rows(bill):
        write(row.kind, row.values)
    for price in price_rows(made):
        write("price", {**price, "price_rule": price["rule"]})
    for card in card_rows(bill):
        write("card", {**card, "card_hours": card["hours"], "card_cost": card["cost"]})
    if bill.comparison is not None:
        *groups, total = comparison_rows(bill)
        for record in groups:
            write("device-metrics", record)
        write("device-metrics-total", {**total, "real_cost": bill.comparison.real_cost})
    return buffer.getvalue()


def _csv_number(value: Any) -> str:
    return f"{value:.6f}" if isinstance(value, float) else str(value)


def bill_document(bill: Bill, made: Provenance) -> dict:
    def number(value: float) -> float:
        return round(value, 6)

    def numbers(record: dict[str, Any]) -> dict[str, Any]:
        return {key: (number(value) if isinstance(value, float) else value) for key, value in record.items()}

    return {
        "generated_at": iso(made.generated_at),
        "gpu_fence_version": made.version,
        "source": made.source,
        "range": {
            "start": iso(bill.start),
            "end": iso(bill.end),
            "step_seconds": made.step,
            "series": made.series.value,
        },
        "method": bill.method.value,
        "idle_policy": bill.idle_policy.value,
        "group_by": made.group_by,
        "currency": bill.currency,
        "prices": [numbers(price) for price in price_rows(made)],
        "total_gpu_cost": number(bill.total_gpu_cost),
        "card_hours": number(bill.gpu_hours),
        "groups": [numbers(row.values) for row in rows(bill) if row.kind == "group"],
        "unattributed": {"cost": number(bill.unattributed), "memory_gib_hours": number(bill.unattributed_gib_hours)},
        "platform": {"cost": number(bill.platform)},
        "overreach": [
            {
                "namespace": item.owner.namespace,
                "pod": item.owner.pod,
                "container": item.owner.container,
                "group": item.owner.group,
                "node": item.node,
                "gpu_uuid": item.gpu_uuid,
                "memory_gib_hours": number(item.gib_hours),
                "cost": number(item.cost),
            }
            for item in bill.overreach
        ],
        "cards": [numbers(card) for card in card_rows(bill)],
        "timeline": [
            {
                "start": iso(point.start),
                "end": iso(point.end),
                "costs": {name: number(cost) for name, cost in sorted(point.costs.items())},
            }
            for point in bill.timeline
        ],
        "notes": list(bill.notes),
        **({"device_metrics": _comparison_document(bill, bill.comparison)} if bill.comparison is not None else {}),
    }


def _comparison_document(bill: Bill, found: DeviceMetricBill) -> dict[str, Any]:
    *groups, other, _ = comparison_rows(bill)
    return {
        "groups": [{key: round(v, 6) if isinstance(v, float) else v for key, v in g.items()} for g in groups],
        "other_cost": round(float(other["gpu_fence_cost"]), 6),
        "totals": {
            "gpu_fence_cost": round(found.gpu_fence_total, 6),
            "device_hours_cost": round(found.device_hours_total, 6),
            "utilisation_cost": round(found.utilisation_total, 6),
            "real_cost": round(found.real_cost, 6),
        },
        "notes": list(found.notes),
    }


def render_json(bill: Bill, made: Provenance) -> str:
    return json.dumps(bill_document(bill, made), indent=2) + "\n"


def bill_schema() -> dict:
    """The JSON Schema every ``--format json`` document satisfies (shipped beside this module)."""
    return json.loads(resources.files(__package__).joinpath(SCHEMA).read_text(encoding="utf-8"))
