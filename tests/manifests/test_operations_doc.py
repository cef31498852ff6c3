"""Procedures of docs/operations.md, replayed command by command against the API fake with the real ``certs``."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonpatch
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from gpu_fence.webhook import cli
from tests.fakes.kubeapi_webhooks import FakeKubeApi, FakeKubeApiServer

from .conftest import NAMESPACE, REPO, one, pod_spec, render

OPERATIONS = REPO / "docs" / "operations.md"
SECRET = "gpu-fence-webhook-tls"


def code_block_after(marker: str) -> list[str]:
    """The shell commands of the first fenced block after ``marker`` (continuation lines joined, comments dropped)."""
    text = OPERATIONS.read_text(encoding="utf-8")
    start = text.index(marker)
    block = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert block, f"no sh block after {marker!r}"
    joined = block.group(1).replace("\\\n", " ")
    commands: list[str] = []
    pending = ""
    for line in joined.splitlines():
        if not pending and (not line.strip() or line.strip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line.strip()
        try:
            shlex.split(pending)
        except ValueError:  # a quote continues on the next line
            continue
        commands.append(pending)
        pending = ""
    assert not pending, f"unbalanced quotes in the block after {marker!r}"
    return commands


class Cluster:
    """The API fake plus what `kubectl` does for the few commands the procedures use."""

    def __init__(self, api: FakeKubeApi, kubeconfig: Path) -> None:
        self.api, self.kubeconfig = api, kubeconfig
        cronjob = one(render("base"), "CronJob", "gpu-fence-certs")
        self.certs_args = [a.replace("$(POD_NAMESPACE)", NAMESPACE) for a in pod_spec(cronjob)["containers"][0]["args"]]

    def run_certs(self) -> None:
        assert cli.main([*self.certs_args, "--kubeconfig", str(self.kubeconfig)]) == 0

    def kubectl(self, command: str) -> None:
        argv = shlex.split(command)
        assert argv[:3] == ["kubectl", "-n", NAMESPACE], command
        verb, rest = argv[3], argv[4:]
        key = (NAMESPACE, SECRET)
        if verb == "wait":
            return
        if verb == "create" and rest[:2] == ["job", "--from=cronjob/gpu-fence-certs"]:
            self.run_certs()
        elif verb == "delete" and rest == ["secret", SECRET]:
            del self.api.secrets[key]
        elif verb == "patch" and rest[:2] == ["secret", SECRET] and "--type=json" in rest:
            patch = json.loads(rest[rest.index("-p") + 1])
            patched = jsonpatch.apply_patch(self.api.secrets[key], patch)
            assert {"tls.crt", "tls.key"} <= set(patched["data"]), "the API server refuses a TLS Secret without them"
            self.api.secrets[key] = patched
        else:
            raise AssertionError(f"the replay does not know: {command}")

    def data(self) -> dict[str, bytes]:
        return {k: base64.b64decode(v) for k, v in self.api.secrets[(NAMESPACE, SECRET)]["data"].items()}

    def trusted(self, leaf_pem: bytes) -> bool:
        """The API server's view: the leaf is signed by a CA of every webhook's caBundle."""
        leaf = x509.load_pem_x509_certificate(leaf_pem)
        for configuration in self.api.webhooks.values():
            for hook in configuration["webhooks"]:
                cas = x509.load_pem_x509_certificates(base64.b64decode(hook["clientConfig"]["caBundle"]))
                if not any(_issued_by(leaf, ca) for ca in cas):
                    return False
        return True


def _issued_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _cluster(api: FakeKubeApi, server: FakeKubeApiServer, tmp_path: Path) -> Cluster:
    for obj in render("base"):
        if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            kind = obj["kind"].removesuffix("WebhookConfiguration").lower()
            api.add_webhooks(kind, obj["metadata"]["name"], [hook["name"] for hook in obj["webhooks"]])
    return Cluster(api, server.kubeconfig(tmp_path))


def test_rotate_now_replaces_the_certificate_without_locking_out_replicas_that_still_serve_the_old_one(
    tmp_path: Path,
) -> None:
    api = FakeKubeApi()
    with FakeKubeApiServer(api) as server:
        cluster = _cluster(api, server, tmp_path)
        cluster.run_certs()  # the install
        before: dict[str, Any] = cluster.data()
        for command in code_block_after("* Rotate now"):
            cluster.kubectl(command)
        after = cluster.data()
    assert after["tls.crt"] != before["tls.crt"] and after["tls.key"] != before["tls.key"], "rotated"
    assert cluster.trusted(after["tls.crt"])
    # the kubelet refreshes mounted Secrets lazily: replicas serve the old pair for a while yet
    assert cluster.trusted(before["tls.crt"]), "replicas that still serve the old certificate are refused"


KUBECTL_SHIM = r"""#!/bin/bash
# Stands in for kubectl in the shell pipelines of the docs: answers `get` from, and records `patch`/`create` in, $STATE.
set -euo pipefail
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    get) base64 -w0 < "$STATE/ca.crt"; exit 0 ;;
    patch) while [[ "${args[i]}" != "-p" ]]; do i=$((i + 1)); done
           printf '%s' "${args[i+1]}" > "$STATE/patch.json"; exit 0 ;;
    create) touch "$STATE/job"; exit 0 ;;
  esac
done
exit 1
"""


def test_dropping_the_old_ca_after_a_ca_key_leak_leaves_only_the_current_ca_trusted(tmp_path: Path) -> None:
    api = FakeKubeApi()
    with FakeKubeApiServer(api) as server:
        cluster = _cluster(api, server, tmp_path)
        cluster.run_certs()
        old = cluster.data()
        for command in code_block_after("* Rotate now"):
            cluster.kubectl(command)
        rotated = cluster.data()
        assert len(x509.load_pem_x509_certificates(rotated["ca.crt"])) == 2, "new CA, then the old one"
        state = tmp_path / "state"
        (tmp_path / "bin").mkdir()
        state.mkdir()
        shim = tmp_path / "bin" / "kubectl"
        shim.write_text(KUBECTL_SHIM)
        shim.chmod(0o755)
        (state / "ca.crt").write_bytes(rotated["ca.crt"])
        script = "\n".join(code_block_after("* After a leak of the CA key"))
        env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}", "STATE": str(state)}
        subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=state, env=env, check=True, timeout=60)
        assert (state / "job").exists()
        key = (NAMESPACE, SECRET)
        api.secrets[key] = jsonpatch.apply_patch(api.secrets[key], json.loads((state / "patch.json").read_text()))
        cluster.run_certs()
        final = cluster.data()
    (current,) = x509.load_pem_x509_certificates(final["ca.crt"])
    assert current == x509.load_pem_x509_certificates(rotated["ca.crt"])[0]
    assert cluster.trusted(final["tls.crt"])
    assert not cluster.trusted(old["tls.crt"]), "the leaked CA is no longer trusted"


# -- lockout recovery ----------------------------------------------------------------------------------------------


def _admitted_while_webhook_is_down(objects: list[dict[str, Any]], pod: dict[str, Any]) -> bool:
    """What the API server decides for a pod in an enforced namespace (labelled so: the base warns elsewhere) when
    no webhook replica answers."""
    from .cel import cel_denials
    from .selectors import namespace_labels, selector_matches

    labels = namespace_labels(pod["metadata"]["namespace"], "enforce")
    for obj in objects:
        if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in obj["webhooks"]:
                if selector_matches(hook.get("namespaceSelector"), labels) and hook["failurePolicy"] == "Fail":
                    return False  # unreachable, fails closed; with Ignore the call is skipped, nothing is mutated
    policies = {o["metadata"]["name"] for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    for binding in (o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"):
        spec = binding["spec"]
        if (
            spec["policyName"] in policies
            and "Deny" in spec["validationActions"]
            and selector_matches(spec["matchResources"].get("namespaceSelector"), labels)
            and cel_denials(pod)
        ):
            return False
    return True


def _replay(objects: list[dict[str, Any]], commands: list[str]) -> list[dict[str, Any]]:
    kinds = {
        "validatingwebhookconfiguration": "ValidatingWebhookConfiguration",
        "mutatingwebhookconfiguration": "MutatingWebhookConfiguration",
        "validatingadmissionpolicybinding": "ValidatingAdmissionPolicyBinding",
    }
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "kubectl" and argv[2] in kinds, command
        kind, names = kinds[argv[2]], [a for a in argv[3:] if not a.startswith("-")]
        if argv[1] == "delete":
            objects = [o for o in objects if not (o["kind"] == kind and o["metadata"]["name"] in names)]
        elif argv[1] == "patch":
            assert "--type=json" in argv
            patch = json.loads(argv[argv.index("-p") + 1])
            objects = [
                jsonpatch.apply_patch(o, patch) if o["kind"] == kind and o["metadata"]["name"] == names[0] else o
                for o in objects
            ]
        else:
            raise AssertionError(f"the replay does not know: {command}")
    return objects


PLAIN_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "namespace": "team-a"},
    "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
}
FAIL_OPEN = "3. **Fail open cluster-wide**"
EMERGENCY = "4. **Emergency**"
VAP_TOO = "With the `vap` overlay, steps 3 and 4"


def test_lockout_recovery_steps_let_pods_through_with_and_without_the_vap_overlay() -> None:
    base = render("base")
    assert not _admitted_while_webhook_is_down(base, PLAIN_POD), "the enforcing entry fails closed"
    for step in (FAIL_OPEN, EMERGENCY):
        assert _admitted_while_webhook_is_down(_replay(base, code_block_after(step)), PLAIN_POD), step
    vap = render("overlays/vap")
    for step in (FAIL_OPEN, EMERGENCY):
        after = _replay(vap, code_block_after(step))
        assert not _admitted_while_webhook_is_down(after, PLAIN_POD), "the policy denies the unpinned pod"
        assert _admitted_while_webhook_is_down(_replay(after, code_block_after(VAP_TOO)), PLAIN_POD), step
