"""The real console script ``gpu-fence-webhook check`` in a subprocess: exit codes, stdin, stderr shape."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

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
    assert done.stdout.decode().splitlines()[-1].startswith("29 pod specs: 6 allowed, 7 mutated, 15 rejected")


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


def test_kustomize_output_through_stdin() -> None:
    # kubectl (with its built-in kustomize) is a test dependency, installed in CI.
    assert shutil.which("kubectl"), "kubectl is needed to render the examples' kustomization"
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(EXAMPLES)], capture_output=True, check=True, timeout=60
    ).stdout
    done = script("-", "--format", "json", stdin=rendered)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    # kustomize renders every resource of the kustomization, in one stream, with no skipped documents.
    assert report["summary"] == {"pod_specs": 29, "allowed": 6, "mutated": 7, "rejected": 15, "exempt": 1, "skipped": 0}
    assert {result["source"] for result in report["results"]} == {"-"}


def test_help_shows_an_example() -> None:
    done = subprocess.run([str(SCRIPT), "check", "--help"], capture_output=True, timeout=60, check=False)
    assert done.returncode == 0
    assert b"helm template my-chart | gpu-fence-webhook check -" in done.stdout
