"""docs/install.md's own kustomization, as a reader writes it, builds and points at the reader's image."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from tests.fakes.processes import run_captured

from .conftest import MANIFESTS, RELEASE_URL, REPO, kubectl, one, pod_spec, render, workloads

INSTALL = REPO / "docs" / "install.md"


def yaml_block_after(text: str, marker: str) -> str:
    block = re.search(re.escape(marker) + r".*?```yaml\n(.*?)```", text, re.S)
    assert block, f"no yaml block after {marker!r}"
    return block.group(1)


def test_the_install_kustomization_with_a_mirror_and_another_team_label_builds(tmp_path: Path) -> None:
    text = INSTALL.read_text(encoding="utf-8")
    heredoc = re.search(r"cat > kustomization.yaml <<'YAML'\n(.*?)\nYAML\n", text, re.S)
    assert heredoc, "the kustomization of step 1"
    directory = tmp_path / "my-gpu-fence"
    directory.mkdir()
    # The release's directory, as the checkout under test holds it.
    local = os.path.relpath(MANIFESTS, directory)
    kustomization, found = RELEASE_URL.subn(lambda match: local + match.group(1), heredoc.group(1))
    assert found == 1, "the kustomization installs from the release tag"
    kustomization += "\n" + yaml_block_after(text, "**A mirror or a registry of your own.**")
    kustomization += yaml_block_after(text, "**The team label.**")
    (directory / "kustomization.yaml").write_text(kustomization, encoding="utf-8")
    result = run_captured([kubectl(), "kustomize", str(directory)], timeout=120)
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    images = {c["image"] for w in workloads(objects) for c in pod_spec(w)["containers"]}
    version = images.pop().rsplit(":", 1)
    assert version[0] == "registry.example.com/mirror/gpu-fence" and not images, "every image from the mirror"
    (auditor,) = [w for w in workloads(objects) if w["metadata"]["name"] == "gpu-fence-auditor"]
    container = pod_spec(auditor)["containers"][0]
    from gpu_fence.auditor.cli import build_parser

    args = build_parser().parse_args([a.replace("$(", "").replace(")", "") for a in container["args"]])
    assert args.pod_label == ["example.com/team"]


def test_the_base_exports_the_team_label() -> None:
    """The chargeback rules and the dashboard group by label_team: the default install must export it."""

    container = pod_spec(one(render("base"), "DaemonSet", "gpu-fence-auditor"))["containers"][0]
    args = container["args"]
    assert args[args.index("--pod-label") + 1] == "team"


def before_you_enforce() -> str:
    text = INSTALL.read_text(encoding="utf-8")
    return text[text.index("## Before you enforce") : text.index("## Roll back")]


def test_before_you_enforce_exempts_exactly_the_agents_the_stacks_rejections_name() -> None:
    from gpu_fence.webhook.config import config_from_mapping
    from gpu_fence.webhook.policy import evaluate
    from tests.fakes.stacks import stack_pods

    [policy] = [
        yaml.safe_load(block) for block in re.findall(r"```yaml\n(# policy.yaml\n.*?)```", before_you_enforce(), re.S)
    ]
    config = config_from_mapping(policy)
    for stack in stack_pods():
        decision = evaluate(stack.pod, config, namespace=stack.namespace)
        if stack.file in ("node-exporter.yaml", "dcgm-exporter.yaml"):
            assert decision.verdict == "exempt", stack.id
            assert f'"{stack.namespace}/{stack.pod["spec"]["serviceAccountName"]}"' in stack.expected.way_out
        else:
            assert decision.verdict == stack.expected.verdict, stack.id


def test_before_you_enforce_names_the_setting_and_the_switch_that_exist(tmp_path: Path) -> None:
    section = before_you_enforce()
    [values] = [
        yaml.safe_load(b) for b in re.findall(r"```yaml\n(# zero-to-jupyterhub values.yaml\n.*?)```", section, re.S)
    ]
    assert values == {"singleuser": {"cloudMetadata": {"blockWithIptables": False}}}
    switch = re.search(r"```yaml\n(components:\n.*?)```", section, re.S)
    assert switch, "the one-line switch"
    site = tmp_path / "site"
    site.mkdir()
    relative = os.path.relpath(MANIFESTS, site)
    text = "resources:\n  - https://github.com/gpu-fence/gpu-fence//manifests/overlays/gpu-operator?ref=v0.2.0\n"
    text, found = RELEASE_URL.subn(lambda match: relative + match.group(1), text + switch.group(1))
    assert found == 2, "the switch names the release's component"
    (site / "kustomization.yaml").write_text(text)
    result = run_captured([kubectl(), "kustomize", str(site)], timeout=120)
    assert result.returncode == 0, result.stderr
    hooks = [
        h
        for o in yaml.safe_load_all(result.stdout)
        if o and o["kind"].endswith("WebhookConfiguration")
        for h in o["webhooks"]
    ]
    modes = {h["name"]: h["namespaceSelector"]["matchExpressions"][1] for h in hooks}
    assert modes["enforce.gpu-fence.io"] == {"key": "gpu-fence.io/mode", "operator": "NotIn", "values": ["warn", "off"]}
