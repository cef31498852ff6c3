"""A :class:`Bill` as text: an aligned table for people, CSV and JSON for tools, markdown for tickets and wikis.

All four show the same rows: one per group, then ``(unattributed)`` (memory of processes outside any container),
``(platform)`` (idle capacity nobody is charged for), and ``TOTAL``. Overreach is a column of its own that is
not part of a group's total; the footer states that billed total + overreach = the GPU cost of the range.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass

from .compute import PLATFORM, UNATTRIBUTED, Bill
from .times import iso

COLUMNS = (
    ("group", "group"),
    ("requested_gpu_hours", "requested GPU-h"),
    ("request_cost", "request cost"),
    ("memory_gib_hours", "memory GiB-h"),
    ("usage_cost", "usage cost"),
    ("idle_cost", "idle share"),
    ("total_cost", "total"),
    ("difference", "total - request"),
    ("overreach_cost", "overreach (apart)"),
)
MONEY = {"request_cost", "usage_cost", "idle_cost", "total_cost", "difference", "overreach_cost"}


@dataclass(frozen=True)
class Row:
    kind: str  # group | unattributed | platform | total
    values: dict[str, float | str]


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
                    "idle_cost": group.idle,
                    "total_cost": group.total,
                    "difference": group.difference,
                    "overreach_cost": group.overreach,
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
    totals: dict[str, float | str] = {"group": "TOTAL"}
    for key, _ in COLUMNS[1:]:
        totals[key] = sum(float(row.values[key] or 0.0) for row in result)
    result.append(Row("total", totals))
    return result


def _cell(key: str, value: float | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value + 0.0:,.2f}"  # + 0.0 turns -0.0 into 0.0, so a zero difference never prints as "-0.00"


def _header(bill: Bill, by: str, step: float) -> list[str]:
    return [
        f"GPU chargeback {iso(bill.start)} .. {iso(bill.end)} (step {step:g} s), by {by}, "
        f"idle: {bill.idle_policy.value}, currency: {bill.currency}",
    ]


def _footer(bill: Bill) -> list[str]:
    billed = sum(group.total for group in bill.groups) + bill.unattributed + bill.platform
    overreach = sum(group.overreach for group in bill.groups)
    lines = [
        f"GPU cost of the range: {bill.total_gpu_cost:,.2f} {bill.currency} over {bill.gpu_hours:,.1f} card-hours "
        f"= billed {billed:,.2f} + overreach {overreach:,.2f}",
    ]
    lines += [f"note: {note}" for note in bill.notes]
    return lines


def render_table(bill: Bill, by: str, step: float) -> str:
    table = [[title for _, title in COLUMNS]]
    table += [[_cell(key, row.values.get(key)) for key, _ in COLUMNS] for row in rows(bill)]
    widths = [max(len(line[index]) for line in table) for index in range(len(COLUMNS))]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        return "  ".join(padded).rstrip()

    out = [*_header(bill, by, step), "", line(table[0]), line(["-" * w for w in widths])]
    out += [line(cells) for cells in table[1:-1]]
    out += [line(["-" * w for w in widths]), line(table[-1]), ""]
    if bill.overreach:
        out.append("Overreach (GPU memory without an allocation; not in any group's total):")
        for item in bill.overreach:
            out.append(
                f"  {item.owner.namespace}/{item.owner.pod}/{item.owner.container} on {item.node} {item.gpu_uuid}: "
                f"{item.gib_hours:,.1f} GiB-h, {item.cost:,.2f}"
            )
        out.append("")
    out += _footer(bill)
    return "\n".join(out) + "\n"


def render_markdown(bill: Bill, by: str, step: float) -> str:
    out = [f"## {_header(bill, by, step)[0]}", ""]
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
    out += [f"{line}  " for line in _footer(bill)]
    return "\n".join(out) + "\n"


def render_csv(bill: Bill, by: str, step: float) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["kind", *[key for key, _ in COLUMNS], "currency", "start", "end"])
    for row in rows(bill):
        values = [row.values.get(key) for key, _ in COLUMNS]
        writer.writerow(
            [
                row.kind,
                *("" if v is None else (f"{v:.6f}" if isinstance(v, float) else v) for v in values),
                bill.currency,
                iso(bill.start),
                iso(bill.end),
            ]
        )
    return buffer.getvalue()


def bill_document(bill: Bill, by: str, step: float) -> dict:
    def number(value: float) -> float:
        return round(value, 6)

    return {
        "range": {"start": iso(bill.start), "end": iso(bill.end), "step_seconds": step},
        "group_by": by,
        "idle_policy": bill.idle_policy.value,
        "currency": bill.currency,
        "total_gpu_cost": number(bill.total_gpu_cost),
        "card_hours": number(bill.gpu_hours),
        "groups": [
            {key: (value if isinstance(value, str) else number(value)) for key, value in row.values.items()}
            for row in rows(bill)
            if row.kind == "group"
        ],
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
        "timeline": [
            {"end": iso(point.end), "costs": {name: number(cost) for name, cost in sorted(point.costs.items())}}
            for point in bill.timeline
        ],
        "notes": list(bill.notes),
    }


def render_json(bill: Bill, by: str, step: float) -> str:
    return json.dumps(bill_document(bill, by, step), indent=2) + "\n"
