"""``--format focus`` against a real Prometheus: FinOps FOCUS 1.0 rows that the ``focus-validator`` release accepts,
and that add up to the same bill as the JSON."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from tests.fakes.chargeback_scenarios import run_chargeback, window_args
from tests.fakes.focus_validator import validate_focus

pytestmark = pytest.mark.e2e

# FOCUS 1.0 as ratified: the "Column ID" of every specification/columns/*.md at FOCUS_Spec tag v1.0
# (commit f7f58a0a7e545258779839d4f2114819f278c6f3), in the spec's (alphabetical) order.
FOCUS_1_0_COLUMN_IDS = [
    "AvailabilityZone", "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency",
    "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription",
    "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart", "CommitmentDiscountCategory", "CommitmentDiscountId",
    "CommitmentDiscountName", "CommitmentDiscountStatus", "CommitmentDiscountType", "ConsumedQuantity",
    "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "InvoiceIssuerName", "ListCost",
    "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName",
    "RegionId", "RegionName", "ResourceId", "ResourceName", "ResourceType", "ServiceCategory", "ServiceName",
    "SkuId", "SkuPriceId", "SubAccountId", "SubAccountName", "Tags",
]  # fmt: skip


def focus(prometheus, prices_file, window: str, *extra: str) -> str:
    result = run_chargeback(
        "--prometheus", prometheus.url, *window_args(window), "--prices", str(prices_file), "--format", "focus", *extra
    )
    assert result.code == 0, result.stderr
    return result.stdout


def as_json(prometheus, prices_file, window: str, *extra: str) -> dict:
    result = run_chargeback(
        "--prometheus", prometheus.url, *window_args(window), "--prices", str(prices_file), "--format", "json", *extra
    )
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("window", "extra"),
    [
        ("overreach", ()),
        ("mig-idle", ("--idle", "platform")),
        ("timeslice", ("--by", "label:example.com/team")),
        ("replicas", ("--method", "usage")),
    ],
)
def test_rows_pass_the_focus_validator(prometheus, prices_file, tmp_path: Path, window, extra):
    report = validate_focus(focus(prometheus, prices_file, window, *extra), tmp_path)
    assert report.strip().endswith("Validation succeeded."), report


def test_the_validator_rejects_a_damaged_row(prometheus, prices_file, tmp_path: Path):
    rows = list(csv.DictReader(io.StringIO(focus(prometheus, prices_file, "overreach"))))
    rows[0]["BilledCost"] = ""  # FOCUS: BilledCost MUST NOT be null
    rows[1]["ChargeFrequency"] = "Sometimes"
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    report = validate_focus(out.getvalue(), tmp_path)
    assert "Validation failed!" in report
    assert "BilledCost_NotNull failed" in report and "ChargeFrequency_Enum failed" in report


def test_columns_are_focus_1_0_column_ids_then_gpu_fence_columns(prometheus, prices_file):
    header = next(csv.reader(io.StringIO(focus(prometheus, prices_file, "overreach"))))
    assert header[: len(FOCUS_1_0_COLUMN_IDS)] == FOCUS_1_0_COLUMN_IDS
    extra = header[len(FOCUS_1_0_COLUMN_IDS) :]
    assert extra and all(name.startswith("x_") for name in extra)  # FOCUS reserves x_ for custom columns


def test_rows_add_up_to_the_bill_and_sub_accounts_to_group_totals(prometheus, prices_file):
    rows = list(csv.DictReader(io.StringIO(focus(prometheus, prices_file, "overreach"))))
    document = as_json(prometheus, prices_file, "overreach")
    assert sum(Decimal(row["BilledCost"]) for row in rows) == Decimal(str(document["total_gpu_cost"]))
    by_account: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        by_account[row["SubAccountId"]] += Decimal(row["EffectiveCost"])
        assert row["EffectiveCost"] == row["BilledCost"]
        assert float(row["ListCost"]) == pytest.approx(float(row["ListUnitPrice"]) * float(row["PricingQuantity"]))
        assert (row["BillingCurrency"], row["ChargeCategory"], row["ChargeFrequency"]) == (
            "EUR",
            "Usage",
            "Usage-Based",
        )
        assert row["ChargePeriodStart"] == document["range"]["start"]
        assert row["ChargePeriodEnd"] == document["range"]["end"]
        assert row["x_Method"] == document["method"] and row["x_Source"] == prometheus.url
    for group in document["groups"]:
        assert by_account.get(group["group"], Decimal(0)) == Decimal(str(group["total_cost"]))
    # Overreach is its user's: in the sub-account of the namespace that used the capacity without an allocation.
    # Unattributed memory and the platform's idle are sub-accounts of their own, never a team's.
    assert by_account["sneaky"] == Decimal("0.31") and "(overreach)" not in by_account
    assert by_account["(unattributed)"] == Decimal("1.25")
    assert by_account["(platform)"] == Decimal("1.00")
    [miner] = [row for row in rows if row["SubAccountId"] == "sneaky"]
    assert json.loads(miner["Tags"])["gpu-fence/charge"] == "overreach"
    tags = json.loads(miner["Tags"])
    assert tags["gpu-fence/namespace"] == "sneaky" and tags["gpu-fence/pod"] == "miner"
    assert (miner["ResourceId"], miner["ResourceType"], miner["SkuId"]) == ("GPU-o", "GPU", "Tesla T4")


def test_mig_rows_name_the_slice_and_the_team_label_is_a_tag(prometheus, prices_file):
    rows = list(csv.DictReader(io.StringIO(focus(prometheus, prices_file, "mig-idle"))))
    reserved = {row["ResourceId"]: row for row in rows if json.loads(row["Tags"])["gpu-fence/charge"] == "reserved"}
    assert set(reserved) == {"MIG-i2a", "MIG-i2b"}
    assert {row["ResourceType"] for row in reserved.values()} == {"MIG device"}
    assert all(float(row["BilledCost"]) == pytest.approx(2.00) for row in reserved.values())
    assert all(float(row["PricingQuantity"]) == pytest.approx(2 / 7) for row in reserved.values())  # card-hours

    teams = list(
        csv.DictReader(io.StringIO(focus(prometheus, prices_file, "timeslice", "--by", "label:example.com/team")))
    )
    alpha = [row for row in teams if row["SubAccountId"] == "alpha"]
    assert alpha and all(json.loads(row["Tags"])["example.com/team"] == "alpha" for row in alpha)
    assert all(json.loads(row["Tags"])["gpu-fence/namespace"] == "ml" for row in alpha)


def test_a_currency_that_is_not_iso_4217_is_a_one_line_error(prometheus, tmp_path: Path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: credits\ndefault: 1\n", encoding="utf-8")
    result = run_chargeback(
        "--prometheus", prometheus.url, *window_args("overreach"), "--prices", str(prices), "--format", "focus"
    )
    assert result.code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "ISO 4217" in result.stderr and "'credits'" in result.stderr
