"""``--cost-centres FILE``: each row of the bill names its cost centre and every format sums the rows per cost centre
(FOCUS as a tag and an ``x_`` column); a bad file is one line on stderr naming the key, and exit 2."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from pathlib import Path

import pytest

from gpu_fence.chargeback.costcentres import UNASSIGNED, CostCentreError, cost_centres_from_mapping
from tests.fakes.chargeback_scenarios import run_chargeback
from tests.fakes.focus_validator import validate_focus

CENTRES = """\
namespaces:
  genai: "4100 Research"
  "n*": "4100 Research"      # nlp and notebooks
  search: "4200 Search"
labels:
  team:
    data-science: "4300 Data"
platform: "9000 IT"
"""


@pytest.fixture
def centres_file(tmp_path: Path) -> Path:
    path = tmp_path / "cost-centres.yaml"
    path.write_text(CENTRES, encoding="utf-8")
    return path


def demo(output_format: str, centres: Path, *extra: str) -> str:
    result = run_chargeback("--demo", "--format", output_format, "--cost-centres", str(centres), *extra)
    assert result.code == 0, result.stderr
    return result.stdout


def test_exact_names_then_patterns_in_file_order_then_the_default():
    centres = cost_centres_from_mapping(
        {"namespaces": {"ml-*": "A", "ml-special": "B", "*": "C"}, "default": "D"}, "namespace"
    )
    assert (centres.of("ml-special"), centres.of("ml-x"), centres.of("web")) == ("B", "A", "C")
    only_default = cost_centres_from_mapping({"default": "D", "namespaces": {}}, "label:team")
    assert only_default.of("anything") == "D" and only_default.platform is None


@pytest.mark.parametrize(
    ("document", "by", "message"),
    [
        ({"namespace": {"a": "x"}}, "namespace", "unknown key 'namespace'"),
        ({"namespaces": {"a": 4100}}, "namespace", "namespaces.'a' must be a string: quote it (\"4100\")"),
        ({"namespaces": {"a": ""}}, "namespace", "namespaces.'a' must be a non-empty string"),
        ({"namespaces": ["a"]}, "namespace", "namespaces must be a mapping of name to cost centre"),
        ({"platform": 9000}, "namespace", "platform must be a string"),
        ({"namespaces": {"a": "x"}}, "label:team", "maps no group of a bill --by label:team: add labels: {team: ...}"),
        ({"labels": {"team": {"a": "x"}}}, "namespace", "maps no group of a bill --by namespace: add namespaces:"),
        ([1, 2], "namespace", "expected a mapping"),
    ],
)
def test_a_bad_file_names_the_key_to_fix(document, by, message):
    with pytest.raises(CostCentreError, match="^cost centres: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        cost_centres_from_mapping(document, by)


def test_the_command_refuses_a_bad_file_in_one_line(tmp_path: Path):
    for text, message in (
        ("namespaces: {genai: 4100}\n", "namespaces.'genai' must be a string"),
        ("namespaces: [\n", "is not valid YAML at line"),
    ):
        path = tmp_path / "centres.yaml"
        path.write_text(text, encoding="utf-8")
        result = run_chargeback("--demo", "--cost-centres", str(path))
        assert result.code == 2 and result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
        assert f"cost centres file {path}" in result.stderr and message in result.stderr
    result = run_chargeback("--demo", "--cost-centres", str(tmp_path / "missing.yaml"))
    assert result.code == 2 and "cannot read cost centres file" in result.stderr


def test_every_format_names_and_sums_the_cost_centres(centres_file: Path, tmp_path: Path):
    document = json.loads(demo("json", centres_file), parse_float=Decimal)
    by = {group["group"]: group["cost_centre"] for group in document["groups"]}
    assert by == {
        "genai": "4100 Research",
        "search": "4200 Search",
        "notebooks": "4100 Research",
        "nlp": "4100 Research",
        "batch": None,
        "vision": None,
        "research": None,
    }
    assert document["platform"]["cost_centre"] == "9000 IT" and document["unattributed"]["cost_centre"] is None
    centres = {item["cost_centre"]: (item["rows"], item["total_cost"]) for item in document["cost_centres"]}
    # genai 216.00 + notebooks 52.80 + nlp 24.00; search 108.00; the platform's 108.00; the rest: batch 18.23,
    # vision 18.00, research 0.49, unattributed 0.48.
    assert centres == {
        "4100 Research": (["genai", "notebooks", "nlp"], Decimal("292.80")),
        "4200 Search": (["search"], Decimal("108.00")),
        "9000 IT": (["(platform)"], Decimal("108.00")),
        UNASSIGNED: (["batch", "vision", "research", "(unattributed)"], Decimal("37.20")),
    }
    assert sum(total for _rows, total in centres.values()) == document["total_gpu_cost"] == Decimal("546.00")

    rows = list(csv.DictReader(io.StringIO(demo("csv", centres_file))))
    assert {row["group"]: row["cost_centre"] for row in rows if row["kind"] == "group"}["genai"] == "4100 Research"
    per_centre = {row["cost_centre"]: row["total_cost"] for row in rows if row["kind"] == "cost-centre"}
    assert per_centre == {"4100 Research": "292.80", "4200 Search": "108.00", "9000 IT": "108.00", UNASSIGNED: "37.20"}

    table = demo("table", centres_file)
    assert "Per cost centre:" in table and "cost centres: " + str(centres_file) in table
    assert any(line.startswith("genai ") and "4100 Research" in line for line in table.splitlines())
    markdown = demo("markdown", centres_file)
    assert "### Per cost centre" in markdown and "| 4100 Research | genai, notebooks, nlp | 292.80 |" in markdown
    page = demo("html", centres_file)
    assert '<table id="cost-centres">' in page and '<td class="text" data-key="cost_centre">4100 Research</td>' in page

    focus = demo("focus", centres_file)
    assert validate_focus(focus, tmp_path).strip().endswith("Validation succeeded.")
    summed: dict[str, Decimal] = {}
    for row in csv.DictReader(io.StringIO(focus)):
        tags = json.loads(row["Tags"])
        assert tags.get("gpu-fence/cost-centre", "") == row["x_CostCentre"]
        centre = row["x_CostCentre"] or UNASSIGNED
        summed[centre] = summed.get(centre, Decimal(0)) + Decimal(row["BilledCost"])
    assert summed == {centre: total for centre, (_rows, total) in centres.items()}


def test_by_label_uses_the_labels_section(centres_file: Path):
    document = json.loads(demo("json", centres_file, "--by", "label:team"))
    by = {group["group"]: group["cost_centre"] for group in document["groups"]}
    assert by["data-science"] == "4300 Data" and set(by.values()) == {"4300 Data", None}


def test_without_the_option_there_is_no_cost_centre_anywhere():
    result = run_chargeback("--demo", "--format", "json")
    document = json.loads(result.stdout)
    assert document["cost_centres"] == [] and {group["cost_centre"] for group in document["groups"]} == {None}
    assert "cost centre" not in run_chargeback("--demo").stdout
