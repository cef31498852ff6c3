"""A :class:`Bill` as text: an aligned table for people, CSV and JSON for tools, markdown for tickets and wikis.

All four show the same rows, in cents that add up (:mod:`~.statement`): one per group, their subtotal,
``(unattributed)`` (memory of processes outside any container), ``(platform)`` (idle capacity nobody is charged
for), and ``TOTAL``, the GPU cost of the range. What a group used without an allocation (overreach) is a column of
its own inside its total. With ``--cost-centres``, each row names its cost centre and a table sums the rows per
cost centre. Each also says how it was made (:class:`~.provenance.Provenance`): the price list as applied and every
card's cost. The JSON follows ``bill.schema.json`` beside this module.
"""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from importlib import resources
from typing import Any

from .bill import Bill
from .comparison import DeviceMetricBill
from .provenance import Provenance
from .statement import COLUMNS, RowKind, Statement, statement
from .times import iso

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
    ("model", "model"),
    ("price_per_gpu_hour", "price/h"),
    ("cards", "cards"),
    ("rule", "price list entry"),
)
CENTRE_COLUMNS = (("cost_centre", "cost centre"), ("rows", "rows"), ("total_cost", "total"))
COMPARISON_COLUMNS = (
    ("group", "group"),
    ("gpu_fence_cost", "this bill"),
    ("device_hours_cost", "device-hours"),
    ("utilisation_cost", "utilisation"),
)
OTHER = f"({RowKind.UNATTRIBUTED.value}, {RowKind.PLATFORM.value})"
SCHEMA = "bill.schema.json"
Columns = tuple[tuple[str, str], ...]


def shown_columns(shown: Statement) -> Columns:
    """The bill's columns with data: a column that is empty in every row (SM activity nowhere sampled, cost
    centres not given) is left out of the tables people read; CSV and JSON keep every column."""
    return tuple(
        (key, title)
        for key, title in COLUMNS
        if key == "group" or any(row.values.get(key) is not None for row in shown.rows)
    )


def card_rows(shown: Statement) -> list[dict[str, Any]]:
    return [
        {
            "node": line.card.node,
            "gpu_uuid": line.card.uuid,
            "model": line.card.model,
            "price_per_gpu_hour": line.card.price_per_hour,
            "hours": line.card.hours,
            "cost": line.cost,
            "unused_cost": line.unused,
        }
        for line in shown.cards
    ]


def price_rows(made: Provenance) -> list[dict[str, Any]]:
    return [
        {
            "rule": item.rule.entry,
            "priced_by": item.rule.described,
            "model": item.model,
            "price_per_gpu_hour": item.price,
            "cards": item.cards,
        }
        for item in made.prices
    ]


def centre_rows(shown: Statement) -> list[dict[str, Any]]:
    return [
        {"cost_centre": centre.centre, "rows": ", ".join(centre.rows), "total_cost": centre.total}
        for centre in shown.centres
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


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if key == "cards":
        return f"{value:d}" if isinstance(value, int) else f"{value:g}"
    return f"{value + 0:,.2f}"  # + 0 turns -0.0 into 0.0, so a zero difference never prints as "-0.00"


def provenance_lines(bill: Bill, made: Provenance) -> list[str]:
    """The facts every format states, as ``label: value`` pairs in one order."""
    lines = [
        f"range: {iso(bill.start)} .. {iso(bill.end)}, step {made.step:g} s, split from {made.split_from}",
        f"method: {bill.method.value}, idle: {bill.idle_policy.value}, grouped by {made.group_by}",
        f"currency: {bill.currency}",
        f"source: {made.source}",
        f"generated: {iso(made.generated_at)} by gpu-fence {made.version}",
    ]
    if made.cost_centres.given:
        lines.append(f"cost centres: {made.cost_centres.file}")
    return lines


def _header(bill: Bill, made: Provenance) -> str:
    return f"GPU chargeback {iso(bill.start)} .. {iso(bill.end)}, by {made.group_by}"


def _footer(bill: Bill, shown: Statement) -> list[str]:
    total = shown.row(RowKind.TOTAL).values["total_cost"]
    subtotal, unattributed, platform = (shown.row(kind).values["total_cost"] for kind in _SPECIAL)
    lines = [
        f"GPU cost of the range: {_cell('', total)} {bill.currency} over {bill.gpu_hours:,.1f} card-hours "
        f"= groups {_cell('', subtotal)} + unattributed {_cell('', unattributed)} + platform {_cell('', platform)}",
    ]
    lines += [f"note: {note}" for note in bill.notes]
    return lines


_SPECIAL = (RowKind.SUBTOTAL, RowKind.UNATTRIBUTED, RowKind.PLATFORM)


def _aligned(columns: Columns, records: list[dict[str, Any]], rules_before: tuple[int, ...] = ()) -> list[str]:
    """A plain-text table; a rule line before each record whose index is in ``rules_before``."""
    table = [[title for _, title in columns]]
    table += [[_cell(key, record.get(key)) for key, _ in columns] for record in records]
    widths = [max(len(line[index]) for line in table) for index in range(len(columns))]
    # Words left, figures right: a column is words when a record holds a string in it (a name, a model).
    words = [index == 0 or any(isinstance(r.get(key), str) for r in records) for index, (key, _) in enumerate(columns)]

    def line(cells: list[str]) -> str:
        padded = (c.ljust(w) if left else c.rjust(w) for c, w, left in zip(cells, widths, words, strict=True))
        return "  ".join(padded).rstrip()

    rule = line(["-" * w for w in widths])
    body = []
    for index, cells in enumerate(table[1:]):
        if index in rules_before:
            body.append(rule)
        body.append(line(cells))
    return [line(table[0]), rule, *body]


def _rules_before(shown: Statement) -> tuple[int, ...]:
    """Rule lines above the groups' subtotal and above the TOTAL."""
    kinds = [row.kind for row in shown.rows]
    return (kinds.index(RowKind.SUBTOTAL), kinds.index(RowKind.TOTAL))


def _overreach_lines(bill: Bill, shown: Statement) -> list[str]:
    if not shown.overreach:
        return []
    out = ["Used without an allocation (overreach; in its group's total, column 'used without allocation'):"]
    for line in shown.overreach:
        item = line.item
        out.append(
            f"  {item.owner.namespace}/{item.owner.pod}/{item.owner.container} on {item.node} {item.gpu_uuid}: "
            f"{line.gib_hours:,.1f} GiB-h, {_cell('cost', line.cost)} {bill.currency} to {item.owner.group}"
        )
    return [*out, ""]


def render_table(bill: Bill, made: Provenance) -> str:
    shown = statement(bill, made.cost_centres)
    out = [_header(bill, made), *provenance_lines(bill, made), ""]
    out += _aligned(shown_columns(shown), [row.values for row in shown.rows], _rules_before(shown))
    out.append("")
    if shown.centres:
        out += ["Per cost centre:", *_aligned(CENTRE_COLUMNS, centre_rows(shown)), ""]
    out += _overreach_lines(bill, shown)
    if bill.comparison is not None:
        out.append("Device metrics (dcgm-exporter's per-pod series) against this bill, not billed:")
        compared = comparison_rows(bill)
        out += _aligned(COMPARISON_COLUMNS, compared, (len(compared) - 1,))
        out += [*comparison_lines(bill), ""]
    out += ["Prices as applied (per card-hour):", *_aligned(PRICE_COLUMNS, price_rows(made)), ""]
    out += ["Cards:", *_aligned(CARD_COLUMNS, card_rows(shown)), ""]
    out += _footer(bill, shown)
    return "\n".join(out) + "\n"


def _markdown_table(columns: Columns, records: list[dict[str, Any]], bold: tuple[int, ...] = ()) -> list[str]:
    out = ["| " + " | ".join(title for _, title in columns) + " |"]
    out.append("|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|")
    for index, record in enumerate(records):
        cells = [_cell(key, record.get(key)) for key, _ in columns]
        if index in bold:
            cells = [f"**{cell}**" for cell in cells]
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return out


def render_markdown(bill: Bill, made: Provenance) -> str:
    shown = statement(bill, made.cost_centres)
    out = [f"## {_header(bill, made)}", ""]
    out += [f"- {line}" for line in provenance_lines(bill, made)]
    out.append("")
    totals = tuple(index for index, row in enumerate(shown.rows) if row.kind in (RowKind.SUBTOTAL, RowKind.TOTAL))
    out += [*_markdown_table(shown_columns(shown), [row.values for row in shown.rows], totals), ""]
    if shown.centres:
        out += ["### Per cost centre", "", *_markdown_table(CENTRE_COLUMNS, centre_rows(shown)), ""]
    if shown.overreach:
        out += [
            "### Used without an allocation (overreach; in its group's total)",
            "",
            "| namespace | pod | container | group | node | GPU | GiB-h | cost |",
            "|---|---|---|---|---|---|---:|---:|",
        ]
        for line in shown.overreach:
            item = line.item
            out.append(
                f"| {item.owner.namespace} | {item.owner.pod} | {item.owner.container} | {item.owner.group} | "
                f"{item.node} | {item.gpu_uuid} | {line.gib_hours:,.1f} | {_cell('cost', line.cost)} |"
            )
        out.append("")
    if bill.comparison is not None:
        out += ["### Device metrics (dcgm-exporter's per-pod series) against this bill, not billed", ""]
        out += [*_markdown_table(COMPARISON_COLUMNS, comparison_rows(bill)), ""]
        out += [*(f"{line}  " for line in comparison_lines(bill)), ""]
    out += ["### Prices as applied (per card-hour)", "", *_markdown_table(PRICE_COLUMNS, price_rows(made)), ""]
    out += ["### Cards", "", *_markdown_table(CARD_COLUMNS, card_rows(shown)), ""]
    out += [f"{line}  " for line in _footer(bill, shown)]
    return "\n".join(out) + "\n"


# CSV is one table: bill rows, then a row per cost centre (kind "cost-centre", with --cost-centres), per price list
# entry (kind "price") and per card (kind "card"), with the columns of all of them; how the bill was made repeats on
# every row so that any row can stand alone.
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
    shown = statement(bill, made.cost_centres)
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

    for row in shown.rows:
        write(row.kind.value, {**row.values, **row.exact})
    for centre in centre_rows(shown):
        write("cost-centre", {**centre, "group": centre["rows"]})
    for price in price_rows(made):
        write("price", {**price, "price_rule": price["rule"]})
    for card in card_rows(shown):
        write("card", {**card, "card_hours": card["hours"], "card_cost": card["cost"]})
    if bill.comparison is not None:
        *groups, total = comparison_rows(bill)
        for record in groups:
            write("device-metrics", record)
        write("device-metrics-total", {**total, "real_cost": bill.comparison.real_cost})
    return buffer.getvalue()


def _csv_number(value: Any) -> str:
    if isinstance(value, Decimal):
        return str(value + 0)
    return f"{value:.6f}" if isinstance(value, float) else str(value)


def _number(value: Any) -> Any:
    """A figure as JSON holds it: cents as the shortest decimal that reads back as them, other floats to 6 places."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, float):
        return round(value, 6)
    return value


def _numbers(record: dict[str, Any]) -> dict[str, Any]:
    return {key: _number(value) for key, value in record.items()}


def bill_document(bill: Bill, made: Provenance) -> dict[str, Any]:
    shown = statement(bill, made.cost_centres)
    subtotal, unattributed, platform, total = (
        {**shown.row(kind).values, **shown.row(kind).exact}
        for kind in (RowKind.SUBTOTAL, RowKind.UNATTRIBUTED, RowKind.PLATFORM, RowKind.TOTAL)
    )
    return {
        "generated_at": iso(made.generated_at),
        "gpu_fence_version": made.version,
        "source": made.source,
        "range": {
            "start": iso(bill.start),
            "end": iso(bill.end),
            "step_seconds": made.step,
            "series": made.series.value,
            "hourly_sums": made.hourly_sums,
        },
        "method": bill.method.value,
        "idle_policy": bill.idle_policy.value,
        "group_by": made.group_by,
        "currency": bill.currency,
        "prices": [_numbers({key: price[key] for key in PRICE_KEYS}) for price in price_rows(made)],
        "total_gpu_cost": _number(shown.total),
        "card_hours": _number(bill.gpu_hours),
        "groups": [_numbers({**row.values, **row.exact}) for row in shown.groups],
        "groups_subtotal": _numbers(
            {key: value for key, value in subtotal.items() if key not in ("group", "cost_centre")}
        ),
        RowKind.UNATTRIBUTED.value: {
            "cost": _number(unattributed["total_cost"]),
            "memory_gib_hours": _number(unattributed["memory_gib_hours"]),
            "cost_centre": unattributed["cost_centre"],
        },
        RowKind.PLATFORM.value: {"cost": _number(platform["total_cost"]), "cost_centre": platform["cost_centre"]},
        "total": _numbers({key: total[key] for key in TOTAL_KEYS}),
        "cost_centres": [
            {"cost_centre": centre.centre, "rows": list(centre.rows), "total_cost": _number(centre.total)}
            for centre in shown.centres
        ],
        "overreach": [
            {
                "namespace": line.item.owner.namespace,
                "pod": line.item.owner.pod,
                "container": line.item.owner.container,
                "group": line.item.owner.group,
                "node": line.item.node,
                "gpu_uuid": line.item.gpu_uuid,
                "memory_gib_hours": _number(line.item.gib_hours),
                "cost": _number(line.cost),
            }
            for line in shown.overreach
        ],
        "cards": [_numbers(card) for card in card_rows(shown)],
        "timeline": [
            {
                "start": iso(point.start),
                "end": iso(point.end),
                "costs": {name: _number(cost) for name, cost in sorted(point.costs.items())},
            }
            for point in bill.timeline
        ],
        "notes": list(bill.notes),
        **({"device_metrics": _comparison_document(bill, bill.comparison)} if bill.comparison is not None else {}),
    }


PRICE_KEYS = ("rule", "model", "price_per_gpu_hour", "cards")
TOTAL_KEYS = ("memory_gib_hours", "usage_cost", "reserved_cost", "idle_cost", "overreach_cost", "total_cost")


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


def bill_schema() -> dict[str, Any]:
    """The JSON Schema every ``--format json`` document satisfies (shipped beside this module)."""
    schema: dict[str, Any] = json.loads(resources.files(__package__).joinpath(SCHEMA).read_text(encoding="utf-8"))
    return schema
