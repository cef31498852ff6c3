"""The Prometheus overlay: promtool checks and unit-tests the rules, each PrometheusRule matches its plain rules
file, the chargeback recording rules are what ``gpu-fence-auditor chargeback --rules`` writes, and the overlay
renders with kustomize.

Regenerate chargeback-rules.yaml and the PrometheusRules after editing rules.yaml or ``rules.py`` with
``python -m tests.chargeback.test_rules``.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpu_fence.chargeback.prices import prices_from_mapping
from gpu_fence.chargeback.rules import glob_re2, rules_file
from tests.fakes.processes import run_captured

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "manifests" / "overlays" / "prometheus"
RULES = OVERLAY / "rules.yaml"
PROMETHEUS_RULE = OVERLAY / "prometheusrule.yaml"
CHARGEBACK_RULES = OVERLAY / "chargeback-rules.yaml"
CHARGEBACK_PROMETHEUS_RULE = OVERLAY / "chargeback-prometheusrule.yaml"
UNIT_TESTS = Path(__file__).with_name("rules_test.yaml")
CHARGEBACK_UNIT_TESTS = Path(__file__).with_name("chargeback_rules_test.yaml")
# (plain rules file, its PrometheusRule, the PrometheusRule's name)
WRAPPED = (
    (RULES, PROMETHEUS_RULE, "gpu-fence"),
    (CHARGEBACK_RULES, CHARGEBACK_PROMETHEUS_RULE, "gpu-fence-chargeback"),
)


def header(rules: Path) -> str:
    return f"""\
# Generated from {rules.name} (a plain Prometheus rules file, checked by promtool): the same groups wrapped in a
# PrometheusRule for the Prometheus Operator. Regenerate with: python -m tests.chargeback.test_rules
"""


def expected_prometheus_rule(rules: Path = RULES, name: str = "gpu-fence") -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "gpu-fence", "app.kubernetes.io/component": "monitoring"},
        },
        "spec": yaml.safe_load(rules.read_text(encoding="utf-8")),
    }


def promtool(*arguments: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed (apt-get install prometheus; CI's .ci/run does)"
    return run_captured([binary, *arguments], timeout=120, cwd=ROOT)


@pytest.mark.parametrize("rules", [RULES, CHARGEBACK_RULES], ids=["alerts-and-memory", "chargeback-split"])
def test_promtool_check_rules(rules: Path):
    result = promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("tests", [UNIT_TESTS, CHARGEBACK_UNIT_TESTS], ids=["alerts-and-memory", "chargeback-split"])
def test_promtool_unit_tests_for_alerts_and_recording_rules(tests: Path):
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_chargeback_rules_are_what_the_command_writes():
    assert CHARGEBACK_RULES.read_text(encoding="utf-8") == rules_file(), (
        "chargeback-rules.yaml drifted from rules.py: run python -m tests.chargeback.test_rules"
    )


def unit_tests_against(rules: Path, broken: str, tests: Path, directory: Path) -> subprocess.CompletedProcess[str]:
    """``tests`` run against ``broken`` text in place of ``rules``."""
    assert broken != rules.read_text(encoding="utf-8")
    (directory / rules.name).write_text(broken, encoding="utf-8")
    text = tests.read_text(encoding="utf-8").replace(
        f"../../manifests/overlays/prometheus/{rules.name}", str(directory / rules.name)
    )
    assert str(directory / rules.name) in text, f"{tests.name} no longer names {rules.name} where this expects it"
    (directory / tests.name).write_text(text, encoding="utf-8")
    return promtool("test", "rules", str(directory / tests.name))


def test_the_chargeback_unit_tests_can_fail(tmp_path: Path):
    # The same unit tests against rules where a holder without memory reserves nothing must fail.
    broken = rules_file().replace("charge: reserved", "charge: not-reserved")
    result = unit_tests_against(CHARGEBACK_RULES, broken, CHARGEBACK_UNIT_TESTS, tmp_path)
    assert result.returncode != 0
    assert "gpu_container:gpu_fence_chargeback_booked:card_ratio" in result.stdout + result.stderr


def test_promtool_unit_tests_can_fail(tmp_path: Path):
    # The same unit tests against rules where GPUOverreach never fires must fail: the tests really check.
    broken = RULES.read_text(encoding="utf-8").replace('{kind="used-unallocated"}) > 0', '{kind="nope"}) > 0')
    result = unit_tests_against(RULES, broken, UNIT_TESTS, tmp_path)
    assert result.returncode != 0
    assert "GPUOverreach" in result.stdout + result.stderr


@pytest.mark.parametrize(("rules", "wrapped", "name"), WRAPPED, ids=["alerts-and-memory", "chargeback-split"])
def test_each_prometheus_rule_is_its_rules_file(rules: Path, wrapped: Path, name: str):
    assert wrapped.read_text(encoding="utf-8").startswith(header(rules))
    assert yaml.safe_load(wrapped.read_text(encoding="utf-8")) == expected_prometheus_rule(rules, name), (
        f"{wrapped.name} drifted from {rules.name}: run python -m tests.chargeback.test_rules"
    )


def test_overlay_renders_with_kustomize():
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed (CI's .ci/run installs it)"
    result = run_captured([kubectl, "kustomize", str(OVERLAY)], timeout=120)
    assert result.returncode == 0, result.stderr
    documents = [document for document in yaml.safe_load_all(result.stdout) if document]
    kinds = {(document["kind"], document["metadata"]["name"]) for document in documents}
    assert ("ServiceMonitor", "gpu-fence-auditor") in kinds
    assert ("ServiceMonitor", "gpu-fence-webhook") in kinds
    assert ("DaemonSet", "gpu-fence-auditor") in kinds  # the base is included
    rules = {document["metadata"]["name"]: document for document in documents if document["kind"] == "PrometheusRule"}
    for plain, _wrapped, name in WRAPPED:
        assert rules[name]["metadata"]["namespace"] == "gpu-fence"
        assert rules[name]["spec"] == yaml.safe_load(plain.read_text(encoding="utf-8"))
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    monitor = by_kind[("ServiceMonitor", "gpu-fence-auditor")]
    # The workload's namespace/pod/container labels must survive the scrape.
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    service = by_kind[("Service", "gpu-fence-auditor")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert any(port["name"] == "metrics" for port in service["spec"]["ports"])


def write() -> None:
    CHARGEBACK_RULES.write_text(rules_file(), encoding="utf-8")
    for rules, wrapped, name in WRAPPED:
        body = yaml.safe_dump(expected_prometheus_rule(rules, name), sort_keys=False, width=120)
        wrapped.write_text(header(rules) + body, encoding="utf-8")


if __name__ == "__main__":
    write()


PATTERN = st.text(alphabet="ab.*?[]!^-\\", max_size=8)


@settings(max_examples=400, deadline=None)
@given(pattern=PATTERN, name=st.text(alphabet="ab.*?[]!^-\\", max_size=8))
@example(pattern="[]a]", name="]")
@example(pattern="[!]a]", name="b")
@example(pattern="[z-a]b", name="ab")
@example(pattern="[!z-a]", name="q")
@example(pattern="a[", name="a[")
@example(pattern="[a-]", name="-")
def test_a_node_pattern_matches_in_promql_what_it_matches_in_the_price_list(pattern: str, name: str):
    # RE2's syntax is a subset of Python's for what glob_re2 writes; anchored, as PromQL's =~ is.
    assert bool(re.fullmatch(glob_re2(pattern), name)) == fnmatch.fnmatchcase(name, pattern)


def test_the_price_rules_price_every_card_as_the_price_list_does(tmp_path: Path):
    prices = prices_from_mapping(
        {
            "currency": "EUR",
            "default": 2.5,
            "models": {"NVIDIA H100 80GB HBM3": 4.0, "Tesla T4": 0.5, "NVIDIA A100 (PCIe)": 3.25},
            "nodes": {"spot-*": 1.1, "gpu-[!a]?": 1.75, "spot-7": 9.0, "[]x]*": 6.0, "[z-a]*": 7.0},
        }
    )
    # (node, card, model of the card's own series): exact node beats its pattern, a pattern beats the model,
    # a model with regex characters matches literally, and a card nothing names takes the default.
    cards = [
        ("spot-7", "GPU-1", "Tesla T4"),
        ("spot-3", "GPU-2", "Tesla T4"),
        ("gpu-b1", "GPU-3", "NVIDIA H100 80GB HBM3"),
        ("gpu-a1", "GPU-4", "NVIDIA H100 80GB HBM3"),
        ("n1", "GPU-5", "NVIDIA A100 (PCIe)"),
        ("n1", "GPU-6", "NVIDIA A100 PCIe"),
        ("n2", "GPU-7", "Tesla T4"),
        ("]x1", "GPU-8", "Tesla T4"),  # the Go regexp engine reads the sets as Python's fnmatch does
        ("za", "GPU-9", "Tesla T4"),  # an empty range matches nothing
    ]
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_file(prices=prices), encoding="utf-8")
    series = [
        {
            "series": f'gpu_fence_gpu_info{{node="{node}",gpu_uuid="{card}",parent_uuid="",model="{model}",'
            'mig_profile=""}',
            "values": "1x5",
        }
        for node, card, model in cards
    ]
    expected = [
        {
            "labels": f'card:gpu_fence_chargeback_price:per_hour{{node="{node}",card_uuid="{card}",model="{model}",'
            'currency="EUR"}',
            "value": prices.per_hour(node, model),
        }
        for node, card, model in cards
    ]
    assert len({sample["value"] for sample in expected}) == 8  # all but the empty range price a card
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {"expr": "card:gpu_fence_chargeback_price:per_hour", "eval_time": "2m", "exp_samples": expected}
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests), encoding="utf-8")
    assert promtool("check", "rules", str(rules)).returncode == 0
    result = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
