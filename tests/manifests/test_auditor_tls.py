"""components/auditor-tls: the auditor reads the web configuration it mounts, its probes speak HTTPS, and the
ServiceMonitor scrapes with the matching TLS settings."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import yaml

from gpu_fence.auditor.cli import build_parser
from gpu_fence.auditor.webconfig import ClientAuth, load_web_config
from gpu_fence.webhook.certs import new_ca, new_serving_cert
from tests.fakes.processes import run_captured

from .conftest import MANIFESTS, kubectl, one, pod_spec


def test_the_component_mounts_a_configuration_the_auditor_accepts(tmp_path: Path) -> None:
    directory = tmp_path / "mine"
    directory.mkdir()
    (directory / "kustomization.yaml").write_text(
        f"resources:\n  - {os.path.relpath(MANIFESTS / 'overlays' / 'prometheus', directory)}\n"
        f"components:\n  - {os.path.relpath(MANIFESTS / 'components' / 'auditor-tls', directory)}\n",
        encoding="utf-8",
    )
    result = run_captured([kubectl(), "kustomize", str(directory)], timeout=120)
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    spec = pod_spec(one(objects, "DaemonSet", "gpu-fence-auditor"))
    container = spec["containers"][0]
    args = build_parser().parse_args([a.replace("$(", "").replace(")", "") for a in container["args"]])
    assert (
        container["readinessProbe"]["httpGet"]["scheme"] == container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    )
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_dir = str(Path(args.web_config_file).parent)
    configmap = one(objects, "ConfigMap", volumes[mounts[config_dir]]["configMap"]["name"])
    tls_dir = "/etc/gpu-fence/tls"
    assert volumes[mounts[tls_dir]]["secret"]["secretName"] == "gpu-fence-auditor-tls"
    # The mounted file, with the Secret's files where the pod would see them.
    text = configmap["data"][Path(args.web_config_file).name].replace(tls_dir, str(tmp_path))
    ca = new_ca(common_name="ca", now=dt.datetime.now(dt.UTC), days=1)
    serving = new_serving_cert(ca, ["gpu-fence-auditor.gpu-fence.svc"], now=dt.datetime.now(dt.UTC), days=1)
    for name, data in (("tls.crt", serving.cert_pem), ("tls.key", serving.key_pem), ("ca.crt", ca.cert_pem)):
        (tmp_path / name).write_bytes(data)
    (tmp_path / "web.yaml").write_text(text, encoding="utf-8")
    assert load_web_config(tmp_path / "web.yaml").client_auth is ClientAuth.REQUIRED
    endpoint = one(objects, "ServiceMonitor", "gpu-fence-auditor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["serverName"] == "gpu-fence-auditor.gpu-fence.svc"
    assert {endpoint["tlsConfig"]["cert"]["secret"]["name"], endpoint["tlsConfig"]["keySecret"]["name"]} == {
        "gpu-fence-auditor-scraper"
    }
