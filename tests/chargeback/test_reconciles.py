"""Every dollar of the range is in a row, in every format: each bill of every chargeback scenario (and the demo),
for both methods and both idle policies, rendered as table, CSV, JSON, markdown, HTML and FOCUS and read back from
that output alone. In each, the rows (groups, unattributed, platform) add up to the TOTAL, the TOTAL is the GPU
cost of the range to the cent (the cards' cost, which the bill computes apart from its rows), every group's parts
add up to its total, the groups' subtotal is their sum, and (HTML) the headline is the TOTAL row."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from decimal import Decimal
from html.parser import HTMLParser

import pytest

from gpu_fence.chargeback import make
from gpu_fence.chargeback.settings import Format
from gpu_fence.chargeback.statement import COLUMNS, PARTS, cents
from tests.fakes.chargeback_scenarios import DCGM_WINDOWS, WINDOWS, bill_and_provenance, window_args

pytestmark = pytest.mark.e2e

# Every scenario with a bill ("renamed" is refused, test_recorded) and the demo fleet.
SCENARIOS = [name for name in WINDOWS if name not in ("renamed", *DCGM_WINDOWS)] + ["dcgm-virtual", "demo"]
TITLES = {title: key for key, title in COLUMNS}
ZERO = Decimal("0.00")

Rows = dict[str, dict[str, Decimal | None]]  # row name → column key → amount (None: "-", empty, null)


def amount(text: str) -> Decimal | None:
    text = text.strip().replace(",", "").replace("**", "")
    return None if text in ("", "-", "–") else Decimal(text)


def aligned_table(output: str) -> Rows:
    """The bill's table in the plain-text format: the column spans are those of the dashes under the header."""
    lines = output.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("group "))
    header, rule = lines[start], lines[start + 1]
    spans, position = [], 0
    for dashes in rule.split("  "):
        spans.append((position, position + len(dashes)))
        position += len(dashes) + 2
    keys = [TITLES[header[a:b].strip()] for a, b in spans]
    rows: Rows = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        if set(line.replace(" ", "")) == {"-"}:
            continue
        cells = [line[a:b] for a, b in spans]
        rows[cells[0].strip()] = {key: amount(cell) for key, cell in zip(keys[1:], cells[1:], strict=True)}
    return rows


def markdown_table(output: str) -> Rows:
    """The first markdown table of the output: the bill's."""
    lines = output.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("| "))
    end = next(index for index in range(start, len(lines)) if not lines[index].startswith("|"))
    header, _rule, *body = lines[start:end]
    keys = [TITLES[title.strip()] for title in header.strip().strip("|").split("|")]
    rows: Rows = {}
    for line in body:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[cells[0].replace("*", "")] = {key: amount(cell) for key, cell in zip(keys[1:], cells[1:], strict=True)}
    return rows


def csv_table(output: str) -> Rows:
    rows: Rows = {}
    for record in csv.DictReader(io.StringIO(output)):
        if record["kind"] in ("group", "subtotal", "unattributed", "platform", "total"):
            rows[record["group"]] = {
                key: amount(record[key]) for key, _ in COLUMNS if key not in ("group", "cost_centre")
            }
    return rows


def json_table(output: str) -> Rows:
    document = json.loads(output, parse_float=Decimal)
    rows: Rows = {group["group"]: dict(group) for group in document["groups"]}
    rows["all groups"] = dict(document["groups_subtotal"])
    rows["(unattributed)"] = {
        "total_cost": document["unattributed"]["cost"],
        "usage_cost": document["unattributed"]["cost"],
    }
    rows["(platform)"] = {"total_cost": document["platform"]["cost"], "idle_cost": document["platform"]["cost"]}
    rows["TOTAL"] = dict(document["total"])
    assert document["total_gpu_cost"] == rows["TOTAL"]["total_cost"]
    return {name: {key: _decimal(value) for key, value in row.items() if key != "group"} for name, row in rows.items()}


def _decimal(value: object) -> Decimal | None:
    if value is None or isinstance(value, str):
        return None
    return Decimal(str(value))


class GroupsTable(HTMLParser):
    """The HTML bill's table#groups (cells by data-key) and its headline cards (by data-key)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: Rows = {}
        self.cards: dict[str, str] = {}
        self._table = self._body = False
        self._row: dict[str, str] | None = None
        self._cell: str | None = None
        self._card: str | None = None
        self._bold = False
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {key: value or "" for key, value in attrs}
        if tag == "table":
            self._table = attributes.get("id") == "groups"
        elif tag == "tbody" and self._table:
            self._body = True
        elif tag == "tr" and self._table and self._body:
            self._row = {}
        elif tag in ("td", "th") and self._row is not None and "data-key" in attributes:
            self._cell, self._text = attributes["data-key"], []
        elif tag == "div" and "card" in attributes.get("class", "") and "data-key" in attributes:
            self._card = attributes["data-key"]
        elif tag == "b" and self._card is not None:
            self._text, self._bold = [], True

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row[self._cell] = "".join(self._text)
            self._cell = None
        elif tag == "tr" and self._row:
            name = self._row.pop("group")
            self.rows[name] = {key: amount(value) for key, value in self._row.items() if key != "cost_centre"}
            self._row = None
        elif tag == "table":
            self._table = self._body = False
        elif tag == "b" and self._card is not None:
            self.cards[self._card] = "".join(self._text)  # the amount and its currency
            self._card, self._bold = None, False

    def handle_data(self, data: str) -> None:
        if self._cell is not None or self._bold:
            self._text.append(data)


def html_table(output: str) -> Rows:
    page = GroupsTable()
    page.feed(output)
    headline = page.cards["total"].split()
    # The headline is the TOTAL row: the same amount, in the bill's currency.
    assert amount(headline[-2]) == page.rows["TOTAL"]["total_cost"], (page.cards, page.rows["TOTAL"])
    return page.rows


READERS = {
    "table": aligned_table,
    "markdown": markdown_table,
    "csv": csv_table,
    "json": json_table,
    "html": html_table,
}


def value(row: dict[str, Decimal | None], key: str) -> Decimal:
    found = row.get(key)
    return ZERO if found is None else found


def check_rows(rows: Rows, cost_of_range: Decimal, where: str, quantities: bool) -> None:
    """``quantities``: the GPU-hours held add up too (they do in the tables people read; CSV and JSON carry them
    as computed)."""
    special = ("all groups", "(unattributed)", "(platform)", "TOTAL")
    groups = {name: row for name, row in rows.items() if name not in special}
    total = rows["TOTAL"]
    # Every dollar of the range in a row: groups, unattributed and platform add up to the TOTAL, the cards' cost.
    in_rows = sum((value(row, "total_cost") for row in groups.values()), ZERO)
    in_rows += value(rows["(unattributed)"], "total_cost") + value(rows["(platform)"], "total_cost")
    assert in_rows == value(total, "total_cost") == cost_of_range, where
    for name, row in groups.items():
        shown = [key for key in PARTS if key in row]
        assert sum((value(row, key) for key in shown), ZERO) == value(row, "total_cost"), (where, name)
    subtotal = rows["all groups"]
    for key in (*PARTS, "total_cost", "request_cost", "difference", *(("requested_gpu_hours",) if quantities else ())):
        if key in subtotal:
            assert value(subtotal, key) == sum((value(row, key) for row in groups.values()), ZERO), (where, key)
    for key in (*PARTS, "total_cost"):
        if key in total:
            below = value(subtotal, key) + value(rows["(unattributed)"], key) + value(rows["(platform)"], key)
            assert value(total, key) == below, (where, key)


def check_focus(output: str, rows: Rows, cost_of_range: Decimal, where: str) -> None:
    by_account: dict[str, Decimal] = defaultdict(Decimal)
    for record in csv.DictReader(io.StringIO(output)):
        by_account[record["SubAccountId"]] += Decimal(record["BilledCost"])
    assert sum(by_account.values(), Decimal(0)) == cost_of_range, where
    for name, row in rows.items():
        if name not in ("all groups", "TOTAL"):
            assert by_account.get(name, Decimal(0)) == value(row, "total_cost"), (where, name)


def arguments(scenario: str, method: str, idle: str, prices: str) -> list[str]:
    if scenario == "demo":
        return ["--demo", "--method", method, "--idle", idle]
    return ["--prices", prices, *window_args(scenario), "--method", method, "--idle", idle]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_format_adds_up_to_the_cost_of_the_range(prometheus, prices_file, scenario):
    for method in ("holder", "usage"):
        for idle in ("proportional", "platform"):
            extra = [] if scenario == "demo" else ["--prometheus", prometheus.url]
            bill, made = bill_and_provenance(*extra, *arguments(scenario, method, idle, str(prices_file)))
            # What the cards cost, to the cent: computed from the cards, apart from the rows.
            cost_of_range = Decimal(cents(sum(card.cost for card in bill.cards))).scaleb(-2)
            assert cost_of_range > 0
            rows = {}
            for output_format, read in READERS.items():
                where = f"{scenario} {method} {idle} {output_format}"
                rows = read(make.render(bill, made, Format(output_format)))
                check_rows(rows, cost_of_range, where, quantities=output_format not in ("csv", "json"))
            check_focus(make.render(bill, made, Format.FOCUS), rows, cost_of_range, f"{scenario} {method} {idle}")
