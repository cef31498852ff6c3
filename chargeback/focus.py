"""``--format focus``: the bill as FinOps FOCUS 1.0 cost rows (CSV), for finance tools and OpenCost's custom costs.

One row per ledger line (:class:`~.bill.Line`): a charge on one GPU or MIG device for one group, over the
whole range. The column IDs are those of FOCUS 1.0 as ratified (FOCUS_Spec tag ``v1.0``, commit ``f7f58a0``,
``specification/columns/*.md``), in the spec's order; gpu-fence's own columns carry the ``x_`` prefix the spec
reserves for them. The rows add up (``BilledCost``) to the GPU cost of the range, to the cent: each row of the bill
(:mod:`~.statement`) is a sub-account, a group's including what it used without an allocation, the platform's idle
and the unattributed memory in their own (``(platform)``, ``(unattributed)``), and its cents are apportioned over
its lines to a millionth in ``BilledCost`` and ``EffectiveCost``, so a finance tool summing a sub-account gets
that row's total (``ListCost`` and ``ContractedCost`` stay the unit price × the quantity, as FOCUS requires of them:
they differ from ``BilledCost`` by less than a cent per row). FOCUS 1.0 has no
cost-centre column; with ``--cost-centres`` the cost centre is a tag (``gpu-fence/cost-centre``) and the column
``x_CostCentre``.
"""

from __future__ import annotations

import csv
import io
import json
import re
from decimal import Decimal

from .bill import PLATFORM, UNATTRIBUTED, Bill, Charge, Line
from .errors import ChargebackError
from .provenance import Provenance
from .statement import line_costs, statement
from .times import iso, iso_seconds

COLUMNS = (
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
)
EXTRA = (
    "x_CostCentre",
    "x_GpuMemoryGiBHours",
    "x_Method",
    "x_IdlePolicy",
    "x_Source",
    "x_Series",
    "x_GeneratedAt",
    "x_GpuFenceVersion",
)
NAME = "gpu-fence"
TAG = "gpu-fence/"  # FOCUS: provider-defined tags carry a provider prefix; pod label keys stay as the user set them
_CURRENCY = re.compile(r"^[A-Z]{3}$")

_DESCRIPTION = {
    Charge.USAGE: "GPU memory share",
    Charge.RESERVED: "held without memory in use (reserved, unused)",
    Charge.IDLE_SHARE: "share of the card's idle capacity",
    Charge.OVERREACH: "GPU memory without an allocation (overreach), charged to its user",
    Charge.UNATTRIBUTED: "GPU memory of processes outside any container",
    Charge.PLATFORM: "idle capacity nobody held or used",
}
_SUB_ACCOUNT = {Charge.UNATTRIBUTED: UNATTRIBUTED, Charge.PLATFORM: PLATFORM}


def _decimal(value: float | Decimal) -> str:
    return f"{value + 0:.6f}"


def _tags(line: Line, group_by: str, centre: str | None) -> str:
    tags = {f"{TAG}charge": line.charge.value, f"{TAG}node": line.node, f"{TAG}card": line.card_uuid}
    if centre:
        tags[f"{TAG}cost-centre"] = centre
    if line.namespace:
        tags[f"{TAG}namespace"] = line.namespace
    if line.group:
        if group_by.startswith("label:"):
            tags[group_by.removeprefix("label:")] = line.group
        tags[f"{TAG}group"] = line.group
    if line.pod:
        tags[f"{TAG}pod"] = line.pod
        tags[f"{TAG}container"] = line.container
    return json.dumps(tags, sort_keys=True)


def focus_rows(bill: Bill, made: Provenance) -> list[dict[str, str]]:
    if not _CURRENCY.match(bill.currency):
        raise ChargebackError(
            f"--format focus needs an ISO 4217 currency code (such as USD or EUR); the price list says "
            f"{bill.currency!r}: set currency: in the price file"
        )
    price = {(card.node, card.uuid): card.price_per_hour for card in bill.cards}
    start, end = iso_seconds(bill.start), iso_seconds(bill.end)
    shown = statement(bill, made.cost_centres)
    centre_of = {row.name: row.values["cost_centre"] for row in shown.rows}
    lines = [line for line in bill.lines if _charged(line)]
    costs = line_costs(bill, shown, keep=_charged)
    rows = []
    for line, cost in zip(lines, costs, strict=True):
        unit_price = price[(line.node, line.card_uuid)]
        account = _SUB_ACCOUNT.get(line.charge, line.group)
        centre = centre_of.get(account)
        is_slice = line.device_uuid != line.card_uuid
        row = dict.fromkeys(COLUMNS, "")
        row.update(
            {
                "BilledCost": _decimal(cost),
                "BillingAccountId": NAME,
                "BillingAccountName": "GPU chargeback",
                "BillingCurrency": bill.currency,
                "BillingPeriodEnd": end,
                "BillingPeriodStart": start,
                "ChargeCategory": "Usage",
                "ChargeDescription": f"{_DESCRIPTION[line.charge]} on {line.node}/{line.device_uuid} ({line.model})",
                "ChargeFrequency": "Usage-Based",
                "ChargePeriodEnd": end,
                "ChargePeriodStart": start,
                "ConsumedQuantity": _decimal(line.card_hours),
                "ConsumedUnit": "GPU-Hours",
                "ContractedCost": _decimal(line.cost),
                "ContractedUnitPrice": _decimal(unit_price),
                "EffectiveCost": _decimal(cost),
                "InvoiceIssuerName": NAME,
                "ListCost": _decimal(line.cost),
                "ListUnitPrice": _decimal(unit_price),
                "PricingCategory": "Standard",
                "PricingQuantity": _decimal(line.card_hours),
                "PricingUnit": "GPU-Hours",
                "ProviderName": NAME,
                "PublisherName": NAME,
                "ResourceId": line.device_uuid,
                "ResourceName": f"{line.node}/{line.device_uuid}",
                "ResourceType": "MIG device" if is_slice else "GPU",
                "ServiceCategory": "Compute",
                "ServiceName": "Kubernetes GPU",
                "SkuId": line.model,
                "SkuPriceId": f"{line.model} at {unit_price:g} {bill.currency}/GPU-hour",
                "SubAccountId": account,
                "SubAccountName": account,
                "Tags": _tags(line, made.group_by, centre if isinstance(centre, str) else None),
                "x_CostCentre": centre if isinstance(centre, str) else "",
                "x_GpuMemoryGiBHours": _decimal(line.gib_hours),
                "x_Method": bill.method.value,
                "x_IdlePolicy": bill.idle_policy.value,
                "x_Source": made.source,
                "x_Series": made.series.value,
                "x_GeneratedAt": iso(made.generated_at),
                "x_GpuFenceVersion": made.version,
            }
        )
        rows.append(row)
    return rows


def _charged(line: Line) -> bool:
    """A line FOCUS writes: one that pays for some card-hours or memory (not an empty booking)."""
    return line.card_hours > 0 or line.gib_hours > 0


def render_focus(bill: Bill, made: Provenance) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*COLUMNS, *EXTRA], lineterminator="\n")
    writer.writeheader()
    writer.writerows(focus_rows(bill, made))
    return buffer.getvalue()
