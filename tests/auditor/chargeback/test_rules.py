"""The Prometheus overlay: promtool checks and unit-tests the rules, the PrometheusRule matches rules.yaml, and
the overlay renders with kustomize.

Regenerate prometheusrule.yaml after editing rules.yaml with ``python -m tests.chargeback.test_rules``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
OVERLAY = ROOT / "manifests" / "overlays" / "prometheus"
RULES = OVERLAY / "rules.yaml"
PROMETHEUS_RULE = OVERLAY / "prometheusrule.yaml"
UNIT_TESTS = Path(__file__).with_name("rules_test.yaml")
HEADER = """\
# Generated from rules.yaml (the plain Prometheus rules file, checked by promtool): the same groups wrapped in a
# PrometheusRule for the Prometheus Operator. Edit rules.yaml, then run: python -m tests.chargeback.test_rules
"""


def expected_prometheus_rule() -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpu-fence",
            "labels": {"app.kubernetes.io/name": "gpu-fence", "app.kubernetes.io/component": "monitoring"},
        },
        "spec": yaml.safe_load(RULES.read_text(encoding="utf-8")),
    }


def promtool(*arguments: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed (apt-get install prometheus; CI's .ci/run does)"
    return subprocess.run([binary, *arguments], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


def test_promtool_check_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_for_overreach_alert_and_recording_rules():
    result = promtool("test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_can_fail(tmp_path: Path):
    # The same unit tests against rules where GPUOverreach never fires must fail: the tests really check.
    broken = RULES.read_text(encoding="utf-8").replace('{kind="used-unallocated"}) > 0', '{kind="nope"}) > 0')
    assert broken != RULES.read_text(encoding="utf-8")
    (tmp_path / "rules.yaml").write_text(broken, encoding="utf-8")
    tests = UNIT_TESTS.read_text(encoding="utf-8").replace(
        "../../../manifests/overlays/prometheus/rules.yaml", str(tmp_path / "rules.yaml")
    )
    (tmp_path / "rules_test.yaml").write_text(tests, encoding="utf-8")
    result = promtool("test", "rules", str(tmp_path / "rules_test.yaml"))
    assert result.returncode != 0
    assert "GPUOverreach" in result.stdout + result.stderr


def test_prometheus_rule_is_rules_yaml():
    assert PROMETHEUS_RULE.read_text(encoding="utf-8").startswith(HEADER)
    assert yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8")) == expected_prometheus_rule(), (
        "prometheusrule.yaml drifted from rules.yaml: run python -m tests.chargeback.test_rules"
    )


def test_overlay_renders_with_kustomize():
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed (CI's .ci/run installs it)"
    result = subprocess.run(
        [kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    documents = [document for document in yaml.safe_load_all(result.stdout) if document]
    kinds = {(document["kind"], document["metadata"]["name"]) for document in documents}
    assert ("ServiceMonitor", "gpu-fence-auditor") in kinds
    assert ("ServiceMonitor", "gpu-fence-webhook") in kinds
    assert ("DaemonSet", "gpu-fence-auditor") in kinds  # the base is included
    rule = next(document for document in documents if document["kind"] == "PrometheusRule")
    assert rule["metadata"]["namespace"] == "gpu-fence"
    assert rule["spec"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    monitor = by_kind[("ServiceMonitor", "gpu-fence-auditor")]
    # The workload's namespace/pod/container labels must survive the scrape.
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    service = by_kind[("Service", "gpu-fence-auditor")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert any(port["name"] == "metrics" for port in service["spec"]["ports"])


def write() -> None:
    body = yaml.safe_dump(expected_prometheus_rule(), sort_keys=False, width=120)
    PROMETHEUS_RULE.write_text(HEADER + body, encoding="utf-8")


if __name__ == "__main__":
    write()
