"""One order for the Kubernetes client's configuration, with the real client loading real kubeconfig files and a
service-account directory: ``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``, then in-cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes.client import Configuration
from kubernetes.config import incluster_config

from gpu_fence.kubeconfig import IN_CLUSTER, KubeConfigError, config_source, load_configuration
from tests.fakes.kubeapi_pods import write_kubeconfig


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty home and no $KUBECONFIG, so that nothing of the machine running the tests is read."""
    directory = tmp_path / "home"
    directory.mkdir()
    monkeypatch.setenv("HOME", str(directory))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    return directory


@pytest.fixture
def service_account(tmp_path, monkeypatch) -> Path:
    """The files and environment a pod's service account gives, at a directory of the test's own."""
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("pod-token")
    (directory / "ca.crt").write_text("not checked at load time")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(directory / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(directory / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return directory


def kubeconfig(directory: Path, name: str) -> Path:
    return write_kubeconfig(directory / name, f"https://{name}.example:6443")


def test_the_flag_wins_over_the_environment_and_the_home_file(home, tmp_path, monkeypatch, service_account):
    (home / ".kube").mkdir()
    kubeconfig(home / ".kube", "config")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path, "from-env")))
    flag = kubeconfig(tmp_path, "from-flag")
    assert load_configuration(str(flag)).host == "https://from-flag.example:6443"
    assert load_configuration(None).host == "https://from-env.example:6443"
    monkeypatch.delenv("KUBECONFIG")
    assert load_configuration(None).host == "https://config.example:6443"
    (home / ".kube" / "config").unlink()
    configuration = load_configuration(None)
    assert configuration.host == "https://10.0.0.1:443"
    assert configuration.api_key["BearerToken"] == "bearer pod-token"


def test_kubeconfig_may_list_several_files_as_kubectl_reads_them(home, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{kubeconfig(tmp_path, 'second')}")
    assert load_configuration(None).host == "https://second.example:6443"


def test_the_environment_is_read_when_asked_not_at_import(home, tmp_path, monkeypatch):
    assert config_source(None) is None
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "later"))
    assert config_source(None) == str(tmp_path / "later")


def test_the_process_wide_default_is_left_alone(home, tmp_path):
    before = Configuration.get_default_copy().host
    load_configuration(str(kubeconfig(tmp_path, "own")))
    assert Configuration.get_default_copy().host == before


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not yaml: [", "while parsing a flow node"),
        ('{"apiVersion": "v1", "kind": "Config"}', "current-context"),
        ("", ""),
    ],
)
def test_an_unusable_file_names_itself(home, tmp_path, content, needle):
    path = tmp_path / "broken"
    path.write_text(content)
    with pytest.raises(KubeConfigError) as caught:
        load_configuration(str(path))
    assert caught.value.source == str(path) and not caught.value.in_cluster
    assert needle in caught.value.reason and "\n" not in caught.value.reason


def test_a_missing_file_given_explicitly_is_an_error_not_a_fallback(home, tmp_path, service_account):
    with pytest.raises(KubeConfigError) as caught:
        load_configuration(str(tmp_path / "missing"))
    assert caught.value.source == str(tmp_path / "missing")


def test_no_source_at_all_is_the_in_cluster_error(home, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError) as caught:
        load_configuration(None)
    assert caught.value.in_cluster and caught.value.source == IN_CLUSTER
    assert "Service host/port is not set" in caught.value.reason


def test_importing_it_does_not_load_the_client():
    code = "import sys, gpu_fence.kubeconfig; sys.exit('kubernetes' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=60).returncode == 0
