"""The real console script ``gpu-fence-webhook check`` in a subprocess: exit codes, stdin, stderr shape."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"
SCRIPT = Path(sys.executable).with_name("gpu-fence-webhook")


def script(*args: str, stdin: bytes | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(SCRIPT), "check", *args], input=stdin, capture_output=True, cwd=cwd, timeout=60, check=False
    )


def test_script_is_installed() -> None:
    assert SCRIPT.exists(), "install the project (pip install -e .) so the console script exists"


def test_examples_directory_exits_1() -> None:
    done = script("manifests/examples/")
    assert done.returncode == 1, done.stderr
    assert done.stderr == b""
    assert done.stdout.decode().splitlines()[-1].startswith("34 pod specs: 6 allowed, 7 mutated, 20 rejected")


def test_clean_file_exits_0_and_json_goes_to_stdout() -> None:
    done = script("manifests/examples/gpu-pod.yaml", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["allowed"] == 1


def test_broken_yaml_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: v1\nkind: Pod\nspec:\n  containers: [\n")
    done = script(str(broken))
    assert done.returncode == 2
    assert done.stdout == b""
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"gpu-fence-webhook check: error: {broken}:5: YAML does not parse")
    assert b"Traceback" not in done.stderr


def test_missing_file_exits_2() -> None:
    done = script("manifests/examples/does-not-exist.yaml")
    assert done.returncode == 2
    assert done.stderr.decode().strip() == (
        "gpu-fence-webhook check: error: manifests/examples/does-not-exist.yaml: no such file or directory"
    )


def kubectl() -> str:
    # kubectl (with its built-in kustomize) is a test dependency, installed in CI (.ci/install-kubectl).
    path = shutil.which("kubectl")
    assert path, "kubectl is needed to render kustomizations"
    return path


def test_the_rendered_base_passes_with_the_shipped_policy_and_no_config() -> None:
    """gpu-fence's own pods (the auditor is privileged) are exempt by the policy the manifests ship, which is
    check's default: a CI gate over the install itself does not flag it."""
    rendered = subprocess.run(
        [kubectl(), "kustomize", str(ROOT / "manifests" / "base")], capture_output=True, check=True, timeout=60
    ).stdout
    done = script("-", "--format", "json", stdin=rendered)
    assert (done.returncode, done.stderr) == (0, b"")
    results = json.loads(done.stdout)["results"]
    assert {(r["kind"], r["name"]) for r in results} >= {
        ("DaemonSet", "gpu-fence-auditor"),
        ("CronJob", "gpu-fence-certs"),
    }
    assert "Job" in {r["kind"] for r in results}
    assert {(r["namespace"], r["verdict"]) for r in results} == {("gpu-fence", "exempt")}


def test_a_kustomization_directory_is_rendered_not_read_as_loose_yaml() -> None:
    done = script("manifests/overlays/warn-only", "--format", "json")
    assert (done.returncode, done.stderr) == (0, b"")
    report = json.loads(done.stdout)
    # the overlay's own directory holds only a kustomization with patches: read as loose YAML it held no pod spec
    assert {r["source"] for r in report["results"]} == {"manifests/overlays/warn-only"}
    assert {r["kind"] for r in report["results"]} == {"Deployment", "DaemonSet", "Job", "CronJob"}
    assert report["summary"]["skipped"] == 0


def test_a_kustomization_met_in_a_walk_is_rendered_and_not_walked_into(tmp_path: Path) -> None:
    app = tmp_path / "deploy" / "app"
    app.mkdir(parents=True)
    (app / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: cpu}\nspec:\n  containers: [{name: main, image: x}]\n"
    )
    # a patch is a fragment: read as loose YAML it would be judged as a pod of its own
    (app / "patch.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: cpu}\nspec:\n  containers: [{name: main, image: y}]\n"
    )
    (app / "kustomization.yaml").write_text("resources: [pod.yaml]\nnamespace: team-a\npatches: [{path: patch.yaml}]\n")
    done = script(str(tmp_path), "--format", "json")
    assert (done.returncode, done.stderr) == (0, b"")
    [result] = json.loads(done.stdout)["results"]
    assert (result["source"], result["namespace"], result["name"], result["verdict"]) == (
        str(app),
        "team-a",
        "cpu",
        "mutated",
    )


def test_a_kustomization_that_does_not_build_exits_2_with_kubectls_reason(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    done = script(str(tmp_path))
    assert (done.returncode, done.stdout) == (2, b"")
    [line] = done.stderr.decode().splitlines()
    assert line.startswith(f"gpu-fence-webhook check: error: {tmp_path}: kubectl kustomize failed: ")
    assert "missing.yaml" in line


def test_a_kustomization_without_kubectl_says_how_to_get_one(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\n")
    done = subprocess.run(
        [str(SCRIPT), "check", str(tmp_path)],
        capture_output=True,
        timeout=60,
        check=False,
        env={"PATH": str(tmp_path / "no-kubectl-here")},
    )
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode().splitlines() == [
        f"gpu-fence-webhook check: error: {tmp_path}: holds a kustomization, which check renders with kubectl "
        f"kustomize, but kubectl is not on PATH: install kubectl (>= 1.27), or render it yourself: "
        f"kustomize build {tmp_path} | gpu-fence-webhook check -"
    ]


NOBODY = 65534
#: The check as an unprivileged user. Tests run as root here and in CI, and root reads everything, so the child runs
#: the check once as root over a file of its own, which loads every module and codec the check imports lazily from
#: wherever the interpreter and the checkout lie, then drops to uid/gid 65534 and runs the check under test; run as
#: another user, it already is unprivileged.
UNPRIVILEGED = """\
import contextlib, io, os, sys
from gpu_fence.webhook import cli
uid, config, *args = sys.argv[1:]
with contextlib.redirect_stdout(io.StringIO()):
    cli.main(["check", "--allow-empty", "--config", config, config])
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(int(uid))
    os.setuid(int(uid))
assert os.geteuid() != 0
sys.exit(cli.main(["check", "--config", config, *args]))
"""


def as_unprivileged_user(top: Path) -> subprocess.CompletedProcess[bytes]:
    """``check TOP`` as uid 65534, with the policy the manifests ship copied beside ``top`` where that user reads it."""
    policy = top.parent / "policy.yaml"
    shutil.copyfile(ROOT / "manifests" / "base" / "policy.yaml", policy)
    policy.chmod(0o644)
    command = [sys.executable, "-c", UNPRIVILEGED, str(NOBODY), str(policy), str(top)]
    return subprocess.run(command, capture_output=True, timeout=60, check=False)


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A directory the unprivileged user can reach: pytest's tmp_path sits under a directory only its owner may
    enter, and so may $TMPDIR."""
    path = Path(tempfile.mkdtemp(prefix="gpu-fence-check-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for folder, _, _ in os.walk(path):
            os.chmod(folder, 0o755)
        shutil.rmtree(path)


PRIVILEGED_POD = (
    "apiVersion: v1\nkind: Pod\nmetadata: {name: sneaky}\n"
    "spec:\n  containers: [{name: main, image: x, securityContext: {privileged: true}}]\n"
)
GPU_POD = (
    "apiVersion: v1\nkind: Pod\nmetadata: {name: gpu}\n"
    "spec:\n  containers: [{name: main, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]\n"
)


def test_unreadable_directories_and_files_anywhere_exit_2_all_listed(world_readable_dir: Path) -> None:
    """A privileged pod in a folder the CI user cannot read used to be skipped without a word (1 allowed, exit 0)."""
    top = world_readable_dir / "manifests"
    top.mkdir(mode=0o755)
    (top / "ok").mkdir(mode=0o755)
    (top / "ok" / "gpu.yaml").write_text(GPU_POD)
    (top / "ok" / "gpu.yaml").chmod(0o644)
    hidden = top / "ok" / "hidden"
    hidden.mkdir()
    (hidden / "sneaky.yaml").write_text(PRIVILEGED_POD)
    hidden.chmod(0o000)
    locked = top / "locked.yaml"
    locked.write_text(PRIVILEGED_POD)
    locked.chmod(0o000)
    done = as_unprivileged_user(top)
    assert (done.returncode, done.stdout) == (2, b""), done.stderr
    assert done.stderr.decode().splitlines() == [
        f"gpu-fence-webhook check: error: {hidden}: cannot read directory: Permission denied",
        f"gpu-fence-webhook check: error: {locked}: cannot read: Permission denied",
    ]


def test_an_unreadable_top_level_directory_exits_2(world_readable_dir: Path) -> None:
    top = world_readable_dir / "manifests"
    top.mkdir()
    (top / "sneaky.yaml").write_text(PRIVILEGED_POD)
    top.chmod(0o000)
    done = as_unprivileged_user(top)
    assert (done.returncode, done.stdout) == (2, b""), done.stderr
    assert done.stderr.decode().splitlines() == [
        f"gpu-fence-webhook check: error: {top}: cannot read directory: Permission denied"
    ]


def test_help_shows_an_example() -> None:
    done = subprocess.run([str(SCRIPT), "check", "--help"], capture_output=True, timeout=60, check=False)
    assert done.returncode == 0
    assert b"helm template my-chart | gpu-fence-webhook check -" in done.stdout


def test_sarif_of_a_rendered_kustomization_points_into_no_file(tmp_path: Path) -> None:
    (tmp_path / "pod.yaml").write_text(PRIVILEGED_POD)
    (tmp_path / "kustomization.yaml").write_text("resources: [pod.yaml]\n")
    done = script(str(tmp_path), "--format", "sarif")
    assert done.returncode == 1, done.stderr
    [result] = json.loads(done.stdout)["runs"][0]["results"]
    assert result["ruleId"] == "privileged"
    # the line is the rendered stream's, which no file holds: a physical location would point at the wrong line
    assert result["locations"] == [
        {"logicalLocations": [{"fullyQualifiedName": "Pod/default/sneaky", "kind": "object"}]}
    ]


# --- YAML as kubectl reads it: the verdict on a manifest is the verdict on what kubectl sends ---------------------

POD_HEAD = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
"""

KUBECTL_READINGS = {
    # go-yaml v2 reads y as true: privileged
    "privileged-y": ("  containers: [{name: a, image: x, securityContext: {privileged: y}}]\n", "rejected"),
    "host-pid-capital-y": ("  hostPID: Y\n  containers: [{name: a, image: x}]\n", "rejected"),
    # a key before `<<` is overridden by the merged mapping
    "merge-overrides": (
        "  containers:\n"
        "    - name: a\n"
        "      image: x\n"
        "      securityContext: {privileged: false, <<: {privileged: true}}\n",
        "rejected",
    ),
    # 0o1 is 1 to kubectl: a GPU container, not pinned; 1e0 is 1 too, and must stay admitted
    "gpu-octal": ("  containers: [{name: a, image: x, resources: {limits: {nvidia.com/gpu: 0o1}}}]\n", "allowed"),
    "gpu-1e0": ("  containers: [{name: a, image: x, resources: {limits: {nvidia.com/gpu: 1e0}}}]\n", "allowed"),
    "gpu-millis": ('  containers: [{name: a, image: x, resources: {limits: {nvidia.com/gpu: "1000m"}}}]\n', "allowed"),
    "not-privileged-n": ("  containers: [{name: a, image: x, securityContext: {privileged: n}}]\n", "mutated"),
}


@pytest.mark.parametrize("name", sorted(KUBECTL_READINGS))
def test_the_verdict_on_yaml_is_the_verdict_on_the_json_kubectl_sends(name: str, tmp_path: Path) -> None:
    spec, verdict = KUBECTL_READINGS[name]
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(POD_HEAD.format(name=name) + spec)
    sent = subprocess.run(
        [kubectl(), "label", "--local", "-f", str(manifest), "-o", "json", "probe=1"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    as_sent = tmp_path / f"{name}.json"
    as_sent.write_bytes(sent.stdout)
    verdicts = []
    for path in (manifest, as_sent):
        done = script(str(path), "--format", "json")
        assert done.returncode in (0, 1), done.stderr
        verdicts.append([result["verdict"] for result in json.loads(done.stdout)["results"]])
    assert verdicts == [[verdict], [verdict]]
