"""``check --cluster``: the real ``kubernetes`` client against a local fake of the pod-list endpoints."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import yaml

from gpu_fence.webhook import check, cli
from gpu_fence.webhook.config import PolicyConfig
from tests.fakes.check_reports import where_and_verdict
from tests.fakes.kubeapi_pods import FakePodsApi, pod, write_kubeconfig
from tests.fakes.pods import as_kai_leaves_it, kai_fraction_pod

REPO = Path(__file__).resolve().parents[2]
CUDA = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
GPU = {"limits": {"nvidia.com/gpu": "1"}}

PODS = [
    pod("default", "trainer", [{"name": "main", "image": CUDA, "resources": GPU}]),
    pod("default", "notebook", [{"name": "main", "image": CUDA}]),
    pod(
        "team-a",
        "sneaky",
        [{"name": "main", "image": CUDA, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}],
    ),
    pod(
        "team-a",
        "pinned",
        [{"name": "main", "image": CUDA, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]}],
    ),
    pod("kube-system", "node-agent", [{"name": "agent", "image": "busybox", "securityContext": {"privileged": True}}]),
]


@pytest.fixture
def api() -> Iterator[FakePodsApi]:
    with FakePodsApi(PODS) as fake:
        yield fake


@pytest.fixture
def kubeconfig(tmp_path: Path, api: FakePodsApi) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", api.url)


def run_cluster(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["check", "--cluster", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_all_namespaces_each_pod_in_its_own_namespace(
    api: FakePodsApi, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cluster(capsys, "--kubeconfig", str(kubeconfig), "--format", "json")
    assert (code, err) == (1, "")
    report = json.loads(out)
    assert where_and_verdict(report) == [
        ("cluster", 0, "Pod", "default", "trainer", "", "allowed"),
        ("cluster", 0, "Pod", "default", "notebook", "", "mutated"),
        ("cluster", 0, "Pod", "team-a", "sneaky", "", "rejected"),
        ("cluster", 0, "Pod", "team-a", "pinned", "", "allowed"),
        ("cluster", 0, "Pod", "kube-system", "node-agent", "", "exempt"),
    ]
    assert report["results"][2]["violations"][0]["rule"] == "visible-devices-env"
    assert [path for path, _ in api.requests] == ["/api/v1/pods"]


def test_one_namespace(api: FakePodsApi, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cluster(capsys, "--kubeconfig", str(kubeconfig), "--namespace", "default", "--format", "json")
    assert code == 0
    assert [r["name"] for r in json.loads(out)["results"]] == ["trainer", "notebook"]
    assert [path for path, _ in api.requests] == ["/api/v1/namespaces/default/pods"]


def test_large_clusters_are_read_in_pages(
    api: FakePodsApi, kubeconfig: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(check, "CLUSTER_PAGE_SIZE", 2)
    code, out, _ = run_cluster(capsys, "--kubeconfig", str(kubeconfig), "--format", "json")
    assert code == 1
    assert json.loads(out)["summary"]["pod_specs"] == len(PODS)
    assert [(query["limit"], query.get("continue")) for _, query in api.requests] == [
        (["2"], None),
        (["2"], ["2"]),
        (["2"], ["4"]),
    ]


def test_kubeconfig_from_the_environment(
    api: FakePodsApi, kubeconfig: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    code, out, err = run_cluster(capsys, "--namespace", "team-a")
    assert (code, err) == (1, "")
    assert "cluster\n  rejected  Pod team-a/sneaky\n" in out


def test_sarif_for_live_pods_has_logical_locations(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cluster(capsys, "--kubeconfig", str(kubeconfig), "--format", "sarif")
    assert code == 1
    [result] = json.loads(out)["runs"][0]["results"]
    [location] = result["locations"]
    assert "physicalLocation" not in location
    assert location["logicalLocations"][0]["fullyQualifiedName"] == "Pod/team-a/sneaky"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_unreachable_api_exits_2_with_the_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = f"http://127.0.0.1:{_closed_port()}"
    config = write_kubeconfig(tmp_path / "kubeconfig", server)
    code, out, err = run_cluster(capsys, "--kubeconfig", str(config))
    assert (code, out) == (2, "")
    assert err.startswith(f"gpu-fence-webhook check: error: cannot reach the Kubernetes API at {server}: ")
    assert len(err.splitlines()) == 1


def test_forbidden_exits_2_with_the_api_message(
    api: FakePodsApi, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.fail_with = (403, 'pods is forbidden: User "tester" cannot list resource "pods" at the cluster scope')
    code, out, err = run_cluster(capsys, "--kubeconfig", str(kubeconfig))
    assert (code, out) == (2, "")
    assert 'refused to list pods: 403 Forbidden: pods is forbidden: User "tester" cannot list' in err
    assert len(err.splitlines()) == 1


def test_a_body_that_is_not_json_exits_2(
    api: FakePodsApi, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.garbage = True
    code, _, err = run_cluster(capsys, "--kubeconfig", str(kubeconfig))
    assert code == 2
    assert "sent a pod list that is not JSON" in err


def test_missing_kubeconfig_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    code, _, err = run_cluster(capsys, "--kubeconfig", str(missing))
    assert code == 2
    assert f"cannot load Kubernetes configuration from {missing}" in err
    assert len(err.splitlines()) == 1


def test_pods_without_a_spec_are_skipped() -> None:
    report = check.check_pods([{"metadata": {"name": "odd"}}, {**PODS[0], "kind": "Pod"}], _config())
    assert report.skipped == 1
    assert [result.name for result in report.results] == ["trainer"]


def _config() -> PolicyConfig:
    return PolicyConfig()


def test_live_pods_are_judged_as_created_so_a_binding_does_not_count_as_spec_node_name() -> None:
    """Every scheduled pod carries spec.nodeName once bound; only a pod *created* with it skips KAI's scheduler and
    binder, which admission alone can tell. A bound KAI fraction pod, as KAI's webhook left it, passes."""
    kai_pod = as_kai_leaves_it(
        kai_fraction_pod(
            {"name": "gpu-workload", "image": CUDA},
            {"name": "sidecar", "image": CUDA, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]},
        )
    )
    spec = {key: value for key, value in kai_pod["spec"].items() if key != "containers"}
    live = pod("team-a", "fraction", kai_pod["spec"]["containers"], **spec, nodeName="gpu-node-1")
    live["metadata"]["annotations"] = kai_pod["metadata"]["annotations"]
    [result] = check.check_pods([live], _config()).results
    assert result.verdict == "allowed", result
    assert live["spec"]["nodeName"] == "gpu-node-1"  # the listed pod itself is left as it was


def test_a_scheduled_gpu_pod_is_no_bound_gpu_pod() -> None:
    """The scheduler's binding sets spec.nodeName on every running GPU pod; bound-gpu-pod is about pods created with
    it, so a live pod is never flagged for it."""
    live = pod("team-a", "trainer", [{"name": "main", "image": CUDA, "resources": GPU}], nodeName="gpu-node-1")
    [result] = check.check_pods([live], _config()).results
    assert result.verdict == "allowed", result


def test_no_pods_exits_2_unless_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A namespace name with a typo lists no pods: that is no evidence that enforcing breaks nothing."""
    with FakePodsApi(PODS) as fake:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url)
        code, out, err = run_cluster(capsys, "--kubeconfig", str(kubeconfig), "--namespace", "team-b")
        assert (code, out) == (2, "")
        assert err.splitlines() == [
            "gpu-fence-webhook check: error: no pods in namespace team-b of the cluster the kubeconfig points at: "
            "check --namespace and the kubeconfig's context, or pass --allow-empty if none are expected"
        ]
        code, out, err = run_cluster(
            capsys, "--kubeconfig", str(kubeconfig), "--namespace", "team-b", "--allow-empty", "--format", "json"
        )
        assert (code, err) == (0, "")
        assert json.loads(out)["summary"]["pod_specs"] == 0


def base_pods() -> list[dict]:
    """The pods the rendered base's workloads create, as the API server would list them."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to render manifests/base"
    rendered = subprocess.run(
        [kubectl, "kustomize", str(REPO / "manifests" / "base")], capture_output=True, check=True, timeout=60, text=True
    ).stdout
    pods = []
    for document in yaml.safe_load_all(rendered):
        spec = (document or {}).get("spec", {})
        template = spec.get("jobTemplate", {}).get("spec", {}).get("template") or spec.get("template")
        if template:
            namespace, name = document["metadata"]["namespace"], document["metadata"]["name"]
            pods.append(pod(namespace, f"{name}-x7k2p", **template["spec"]))
    return pods


def test_cluster_scan_never_flags_gpu_fence_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --config, the scan judges with the policy the manifests ship: the privileged auditor, the webhook and
    the certificate Job run in gpu-fence, which that policy exempts, as the webhook installed from it does."""
    pods = base_pods()
    # (the certificate Job's name carries the release's version after gpu-fence-certs)
    assert {
        re.sub(r"^gpu-fence-certs-.*", "gpu-fence-certs", p["metadata"]["name"].rsplit("-", 1)[0]) for p in pods
    } == {
        "gpu-fence-webhook",
        "gpu-fence-auditor",
        "gpu-fence-certs",
    }
    with FakePodsApi(pods) as fake:
        code, out, err = run_cluster(
            capsys, "--kubeconfig", str(write_kubeconfig(tmp_path / "kubeconfig", fake.url)), "--format", "json"
        )
    assert (code, err) == (0, "")
    assert {(r["namespace"], r["verdict"]) for r in json.loads(out)["results"]} == {("gpu-fence", "exempt")}


def test_without_the_shipped_policy_check_says_so_loudly(
    kubeconfig: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(check, "SHIPPED_POLICY", "not-installed.yaml")
    code, _, err = run_cluster(capsys, "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert err.splitlines() == [
        "gpu-fence-webhook check: warning: not-installed.yaml (the policy the manifests ship) is not installed; "
        "judging with the built-in defaults, which exempt only kube-system: pass --config FILE"
    ]


def test_the_shipped_policy_is_the_file_the_manifests_mount() -> None:
    """One file: the package's shipped-policy.yaml is manifests/base/policy.yaml (a link in the source tree, copied
    into the wheel), and the base's ConfigMap is generated from that file."""
    shipped = resources.files("gpu_fence.webhook").joinpath(check.SHIPPED_POLICY).read_text(encoding="utf-8")
    assert shipped == (REPO / "manifests" / "base" / "policy.yaml").read_text(encoding="utf-8")
    assert check.load_policy(None).exempt_namespaces == ("kube-system", "gpu-fence")
