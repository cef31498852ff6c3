"""Render the kustomize base and every overlay once per test session, with the real ``kubectl kustomize``.

CI installs kubectl where it is missing (``.ci/install-kubectl``), so a missing kubectl is an error here, not a
skip: a manifest that was never rendered was never tested.
"""

from __future__ import annotations

import re
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.processes import run_captured

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
#: A release's manifests as docs/install.md names them (the directory, or one below it, at a tag); tests replace it
#: with the checkout's own directory, keeping what follows ``manifests``.
RELEASE_URL = re.compile(r"https://github\.com/gpu-fence/gpu-fence//manifests((?:/[\w/-]*)?)\?ref=v[\d.]+")
#: The namespace every object of the base lives in; overlays keep it.
NAMESPACE = "gpu-fence"


def kustomizations() -> list[str]:
    """``base`` and every overlay directory (relative to manifests/) that holds a kustomization."""
    found = ["base"]
    overlays = MANIFESTS / "overlays"
    found += sorted(f"overlays/{path.name}" for path in overlays.iterdir() if (path / "kustomization.yaml").is_file())
    return found


KUSTOMIZATIONS = kustomizations()


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not installed: run .ci/install-kubectl (it renders the manifests under test)")
    return path


@cache
def render_text(target: str) -> str:
    result = run_captured([kubectl(), "kustomize", str(MANIFESTS / target)], timeout=120)
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize manifests/{target} failed:\n{result.stderr}")
    return result.stdout


def render(target: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize manifests/<target>`` produces (fresh copies: tests may modify them)."""
    return [doc for doc in yaml.safe_load_all(render_text(target)) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = find(objects, kind, name)
    assert len(matches) == 1, f"expected exactly one {kind} {name}, found {len(matches)}"
    return matches[0]


WORKLOAD_KINDS = ("Deployment", "DaemonSet", "Job", "CronJob")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    if workload["kind"] == "CronJob":
        return workload["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return workload["spec"]["template"]["spec"]


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]
