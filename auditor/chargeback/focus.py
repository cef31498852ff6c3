"""``--format focus``: the bill as FinOps FOCUS 1.0 cost rows (CSV), for finance tools and OpenCost's custom costs.

One row per ledger line (:class:`~.compute.Line`): a charge on one GPU or MIG device for one group, over the
whole range. The column IDs are those of FOCUS 1.0 as ratified (FOCUS_Spec tag ``v1.0``, commit ``f7f58a0``,
``specification/columns/*.md``), in the spec's order; gpu-fence's own columns carry the ``x_`` prefix the spec
reserves for them. The rows add up (``BilledCost``) to the GPU cost of the range: the platform's idle, the
unattributed memory and the overreach have sub-accounts of their own (``(platform)``, ``(unattributed)``,
``(overreach)``), so a finance tool summing a team's sub-account gets that team's total and nothing else.
"""

from __future__ import annotations

import csv
import io
import json
import re

from .compute import OVERREACH, PLATFORM, UNATTRIBUTED, Bill, Charge, Line
from .errors import ChargebackError
from .provenance import Provenance
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
    Charge.OVERREACH: "GPU memory without an allocation (overreach)",
    Charge.UNATTRIBUTED: "GPU memory of processes outside any container",
    Charge.PLATFORM: "idle capacity nobody held or used",
}
_SUB_ACCOUNT = {Charge.OVERREACH: OVERREACH, Charge.UNATTRIBUTED: UNATTRIBUTED, Charge.PLATFORM: PLATFORM}


def _decimal(value: float) -> str:
    return f"{value + 0.0:.6f}"


def _tags(line: Line, group_by: str) -> str:
    tags = {f"{TAG}charge": line.charge.value, f"{TAG}node": line.node, f"{TAG}card": line.card_uuid}
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
    rows = []
    for line in bill.lines:
        if line.card_hours <= 0 and line.gib_hours <= 0:
            continue
        unit_price = price[(line.node, line.card_uuid)]
        account = _SUB_ACCOUNT.get(line.charge, line.group)
        is_slice = line.device_uuid != line.card_uuid
        row = dict.fromkeys(COLUMNS, "")
        row.update(
            {
                "BilledCost": _decimal(line.cost),
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
                "EffectiveCost": _decimal(line.cost),
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
                "Tags": _tags(line, made.group_by),
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


def render_focus(bill: Bill, made: Provenance) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*COLUMNS, *EXTRA], lineterminator="\n")
    writer.writeheader()
    writer.writerows(focus_rows(bill, made))
    return buffer.getvalue()
