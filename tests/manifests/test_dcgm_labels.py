"""The dcgm-exporter label rules: checked by promtool, evaluated by Prometheus' own rule engine (``promtool test
rules``) on series as both exporters write them, joined with a DCGM_FI_DEV_* series as the rules file shows, and
shipped as a PrometheusRule identical to the file.

Regenerate the PrometheusRule after editing the rules with ``python -m tests.manifests.test_dcgm_labels``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from tests.fakes.processes import run_captured

from .conftest import MANIFESTS, one, render

OVERLAY = MANIFESTS / "overlays" / "prometheus"
RULES = OVERLAY / "dcgm-labels-rules.yaml"
WRAPPED = OVERLAY / "dcgm-labels-prometheusrule.yaml"
HEADER = """\
# Generated from dcgm-labels-rules.yaml (a plain Prometheus rules file, checked by promtool): the same groups wrapped
# in a PrometheusRule for the Prometheus Operator. Regenerate with: python -m tests.manifests.test_dcgm_labels
"""
FULL, CARD, MIG = "GPU-aaaa", "GPU-bbbb", "MIG-cccc"
#: The join the rules file's header shows.
JOIN = (
    "gpu_container:gpu_fence_container_gpu_memory_bytes:dcgm_labels"
    " / on (UUID, Hostname, GPU_I_PROFILE) group_left () (DCGM_FI_DEV_FB_USED * 1048576)"
)
GIB = 1 << 30


def expected_prometheus_rule() -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "gpu-fence-dcgm-labels",
            "labels": {"app.kubernetes.io/name": "gpu-fence", "app.kubernetes.io/component": "monitoring"},
        },
        "spec": yaml.safe_load(RULES.read_text(encoding="utf-8")),
    }


def promtool(*arguments: str, cwd: Path) -> object:
    binary = shutil.which("promtool")
    assert binary, "promtool is not installed (apt-get install prometheus; CI's .ci/run does)"
    return run_captured([binary, *arguments], timeout=120, cwd=cwd)


def test_promtool_accepts_the_rules() -> None:
    result = promtool("check", "rules", str(RULES), cwd=OVERLAY)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_series_carry_dcgm_exporters_names_and_join_its_series(tmp_path: Path) -> None:
    info = (
        'gpu_fence_gpu_info{{node="gpu-1",gpu_uuid="{}",parent_uuid="{}",model="NVIDIA H100 80GB HBM3",'
        'mig_profile="{}"}}'
    )
    memory = (
        'gpu_fence_container_gpu_memory_bytes{{node="gpu-1",namespace="ml",pod="{}",container="c",gpu_uuid="{}",'
        'allocated="true"}}'
    )
    dcgm = (
        'DCGM_FI_DEV_FB_USED{{UUID="{}",Hostname="gpu-1",modelName="NVIDIA H100 80GB HBM3",gpu="0",GPU_I_PROFILE="{}"}}'
    )
    labels = 'UUID="{}",Hostname="gpu-1",modelName="NVIDIA H100 80GB HBM3"'
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": info.format(FULL, "", ""), "values": "1x5"},
                    {"series": info.format(MIG, CARD, "1g.10gb"), "values": "1x5"},
                    {"series": memory.format("trainer", FULL), "values": f"{GIB}x5"},
                    {"series": memory.format("helper", FULL), "values": f"{GIB // 2}x5"},
                    {"series": memory.format("sliced", MIG), "values": "512x5"},
                    {"series": dcgm.format(FULL, ""), "values": "2048x5"},  # MiB: 2 GiB used
                ],
                "promql_expr_test": [
                    {
                        "expr": "gpu:gpu_fence_gpu_info:dcgm_labels",
                        "eval_time": "2m",
                        "exp_samples": [
                            {
                                "labels": "gpu:gpu_fence_gpu_info:dcgm_labels{"
                                + info.format(FULL, "", "")[len("gpu_fence_gpu_info{") : -1]
                                + f",{labels.format(FULL)}}}",
                                "value": 1,
                            },
                            {
                                "labels": "gpu:gpu_fence_gpu_info:dcgm_labels{"
                                + info.format(MIG, CARD, "1g.10gb")[len("gpu_fence_gpu_info{") : -1]
                                + f',{labels.format(CARD)},GPU_I_PROFILE="1g.10gb"}}',
                                "value": 1,
                            },
                        ],
                    },
                    {
                        "expr": "gpu_container:gpu_fence_container_gpu_memory_bytes:dcgm_labels",
                        "eval_time": "2m",
                        "exp_samples": [
                            {
                                "labels": "gpu_container:gpu_fence_container_gpu_memory_bytes:dcgm_labels{"
                                + f'node="gpu-1",namespace="ml",pod="trainer",container="c",gpu_uuid="{FULL}",'
                                + f'allocated="true",{labels.format(FULL)}}}',
                                "value": GIB,
                            },
                            {
                                "labels": "gpu_container:gpu_fence_container_gpu_memory_bytes:dcgm_labels{"
                                + f'node="gpu-1",namespace="ml",pod="helper",container="c",gpu_uuid="{FULL}",'
                                + f'allocated="true",{labels.format(FULL)}}}',
                                "value": GIB // 2,
                            },
                            {
                                "labels": "gpu_container:gpu_fence_container_gpu_memory_bytes:dcgm_labels{"
                                + f'node="gpu-1",namespace="ml",pod="sliced",container="c",gpu_uuid="{MIG}",'
                                + f'allocated="true",{labels.format(CARD)},GPU_I_PROFILE="1g.10gb"}}',
                                "value": 512,
                            },
                        ],
                    },
                    {
                        # two containers on one GPU (many) to its one DCGM series; the MIG device has none
                        "expr": JOIN,
                        "eval_time": "2m",
                        "exp_samples": [
                            {
                                "labels": f'{{node="gpu-1",namespace="ml",pod="{pod}",container="c",gpu_uuid="{FULL}",'
                                f'allocated="true",{labels.format(FULL)}}}',
                                "value": share,
                            }
                            for pod, share in (("trainer", 0.5), ("helper", 0.25))
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    result = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_join_in_the_rules_file_is_the_one_tested() -> None:
    text = " ".join(RULES.read_text(encoding="utf-8").replace("#", " ").split())
    assert " ".join(JOIN.split()) in text


def test_the_prometheus_rule_is_the_rules_file_and_the_overlay_ships_it() -> None:
    assert WRAPPED.read_text(encoding="utf-8").startswith(HEADER)
    assert yaml.safe_load(WRAPPED.read_text(encoding="utf-8")) == expected_prometheus_rule(), (
        "dcgm-labels-prometheusrule.yaml drifted: run python -m tests.manifests.test_dcgm_labels"
    )
    rule = one(render("overlays/prometheus"), "PrometheusRule", "gpu-fence-dcgm-labels")
    assert rule["spec"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))


def write() -> None:
    WRAPPED.write_text(
        HEADER + yaml.safe_dump(expected_prometheus_rule(), sort_keys=False, width=120), encoding="utf-8"
    )


if __name__ == "__main__":
    write()
