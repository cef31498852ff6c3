"""docs/install.md's own kustomization, as a reader writes it, builds and points at the reader's image."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from tests.fakes.processes import run_captured

from .conftest import MANIFESTS, REPO, kubectl, pod_spec, workloads

INSTALL = REPO / "docs" / "install.md"


def test_the_install_overlay_with_the_team_label_patch_builds(tmp_path: Path) -> None:
    text = INSTALL.read_text(encoding="utf-8")
    heredoc = re.search(r"cat > kustomization.yaml <<'YAML'\n(.*?)\nYAML\n", text, re.S)
    assert heredoc, "the kustomization of step 1"
    patch = re.search(r"To bill GPU memory per team.*?```yaml\n(.*?)```", text, re.S)
    assert patch, "the --pod-label patch"
    directory = tmp_path / "my-gpu-fence"
    directory.mkdir()
    kustomization = heredoc.group(1) + "\n" + patch.group(1)
    kustomization = kustomization.replace(
        "<path-or-git-url-to-gpu-fence>/manifests", os.path.relpath(MANIFESTS, directory)
    )
    (directory / "kustomization.yaml").write_text(kustomization, encoding="utf-8")
    result = run_captured([kubectl(), "kustomize", str(directory)], timeout=120)
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    images = {c["image"] for w in workloads(objects) for c in pod_spec(w)["containers"]}
    assert images == {"registry.example.com/gpu-fence:0.1.0"}
    (auditor,) = [w for w in workloads(objects) if w["metadata"]["name"] == "gpu-fence-auditor"]
    container = pod_spec(auditor)["containers"][0]
    from gpu_fence.auditor.cli import build_parser

    args = build_parser().parse_args([a.replace("$(", "").replace(")", "") for a in container["args"]])
    assert args.pod_label == ["team"]
