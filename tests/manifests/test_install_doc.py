"""docs/install.md's own kustomization, as a reader writes it, builds and points at the reader's image."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from tests.fakes.processes import run_captured

from .conftest import MANIFESTS, REPO, kubectl, one, pod_spec, render, workloads

INSTALL = REPO / "docs" / "install.md"
RELEASE = re.compile(r"https://github\.com/gpu-fence/gpu-fence//manifests(/[\w/-]*)\?ref=v[\d.]+")


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
    kustomization, found = RELEASE.subn(lambda match: local + match.group(1), heredoc.group(1))
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
