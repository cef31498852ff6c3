"""The Dockerfile's build steps work: replay them outside Docker (no engine here) and run both entry points.

The build stage's COPY and RUN instructions are read from the Dockerfile itself and replayed in a temporary
directory that stands for the image's filesystem (absolute paths the stage creates are moved under it), with a
fresh virtual environment standing for the base image's Python. The final stage's COPY --from=build is replayed
too, then ``gpu-fence-webhook --help`` and ``gpu-fence-auditor --help`` run from the copied environment.
This needs PyPI (the wheel's dependencies), as a real image build does; it takes about a minute.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.fakes.processes import run_captured

from .conftest import REPO, pod_spec, render, workloads

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(
            line for line in DOCKERFILE.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")
        ),
    )
    found = []
    for line in text.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def _arguments(steps: list[tuple[str, str]]) -> dict[str, str | None]:
    """The ``ARG`` names of a stage (or of the file), with their defaults."""
    found: dict[str, str | None] = {}
    for keyword, rest in steps:
        if keyword == "ARG":
            name, equals, default = rest.partition("=")
            found[name] = default if equals else None
    return found


def _expanded(text: str, arguments: dict[str, str | None]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda match: arguments.get(match.group(1)) or match.group(0), text)


def test_dockerfile_shape() -> None:
    """What the image must be, read from the Dockerfile without pinning its wording: two stages on one pinned base,
    only the built environment copied into the final one, which runs as the user the manifests expect, labelled
    with the base it was really built on, and with no HEALTHCHECK (Kubernetes ignores it; the manifests probe)."""
    steps = instructions()
    build, final = stages()[0], stages()[-1]
    global_arguments = _arguments([step for step in steps[: steps.index(build[0])]])
    froms = [_expanded(rest, global_arguments).split() for keyword, rest in steps if keyword == "FROM"]
    assert len(froms) == 2 and froms[0][0] == froms[1][0], "two stages on one base image"
    assert len(froms[0]) == 3 and froms[0][1].upper() == "AS", "the build stage is named, for COPY --from"
    assert re.fullmatch(r"docker\.io/library/python:3\.11\.\d+-slim-bookworm", froms[0][0]), (
        "a fully qualified base image with the patch version pinned"
    )
    assert "HEALTHCHECK" not in [keyword for keyword, _ in steps]

    copies = [shlex.split(rest) for keyword, rest in final if keyword == "COPY"]
    assert copies and all(copy[0] == f"--from={froms[0][2]}" for copy in copies), "only build output in the final image"

    (user,) = [rest for keyword, rest in final if keyword == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit(), "a numeric, non-root user and group"
    expected = {
        (context.get("runAsUser"), context.get("runAsGroup"))
        for workload in workloads(render("base"))
        for container in pod_spec(workload)["containers"]
        if (context := container.get("securityContext", {})).get("runAsNonRoot")
    }
    assert expected == {(int(uid), int(gid))}, "the image's user is the one the non-root containers run as"
    assert any(keyword == "ENTRYPOINT" for keyword, _ in final)

    labels = " ".join(rest for keyword, rest in final if keyword == "LABEL")
    for key in ("title", "description", "version", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels
    # the label names the image the build really used, also when --build-arg overrides the base: it is expanded from
    # the same argument as FROM, declared again in the final stage (an ARG does not cross a FROM)
    base_name = re.search(r'org\.opencontainers\.image\.base\.name="([^"]*)"', labels)
    assert base_name is not None
    final_arguments = {**global_arguments, **{k: v for k, v in _arguments(final).items() if v is not None}}
    assert set(re.findall(r"\$\{(\w+)\}", base_name.group(1))) <= set(_arguments(final))
    assert _expanded(base_name.group(1), final_arguments) == froms[1][0]


def _relocate(command: str, root: Path, created: set[str]) -> str:
    """Move absolute paths under ``root`` when their first component is one the build stage creates."""
    pattern = r"(?<![\w./-])/(" + "|".join(sorted(map(re.escape, created))) + r")(?=[/\s]|$)"
    return re.sub(pattern, lambda m: f"{root}/{m.group(1)}", command)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_dockerfile_build_steps_install_both_entry_points(tmp_path: Path) -> None:
    root = tmp_path / "image"
    build_python = tmp_path / "base-python"
    subprocess.run([sys.executable, "-m", "venv", str(build_python)], check=True)
    env = {**os.environ, "PATH": f"{build_python / 'bin'}:{os.environ['PATH']}", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    build, final = stages()[0], stages()[-1]
    created = {"src", "wheels", "opt"}
    workdir = root
    for keyword, rest in build:
        if keyword == "WORKDIR":
            workdir = Path(_relocate(rest, root, created))
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            *sources, target = shlex.split(rest)
            destination = workdir / target
            for source in sources:
                origin = REPO / source.rstrip("/")
                if origin.is_dir():
                    shutil.copytree(
                        origin,
                        destination if target.endswith("/") and len(sources) == 1 else destination / origin.name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                        dirs_exist_ok=True,
                        symlinks=True,  # as COPY does: a link into a file the Dockerfile does not copy breaks here too
                    )
                else:
                    destination.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, destination / origin.name)
        elif keyword == "RUN":
            command = _relocate(rest, root, created)
            result = run_captured(["bash", "-euo", "pipefail", "-c", command], timeout=800, cwd=workdir, env=env)
            assert result.returncode == 0, f"RUN {rest}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    (copy_step,) = [rest for keyword, rest in final if keyword == "COPY"]
    _, source, target = copy_step.split()
    final_root = tmp_path / "final"
    environment = final_root / target.lstrip("/")
    shutil.copytree(Path(_relocate(source, root, created)), environment, symlinks=True)
    assert not (environment / "bin" / "pip").exists(), "no installer in the final environment"
    assert not list(environment.rglob("*.whl")), "no wheel cache in the final environment"
    for program in ("gpu-fence-webhook", "gpu-fence-auditor"):
        result = run_captured(
            [str(environment / "bin" / program), "--help"], timeout=120, env={"PATH": "/usr/bin:/bin"}
        )
        assert result.returncode == 0, result.stderr
        assert "usage:" in result.stdout and "examples:" in result.stdout


LOCKS = {"requirements.lock": "runtime", "requirements-build.lock": "build"}


def _locked(name: str) -> dict[str, tuple[str, list[str]]]:
    """``{package: (version, hashes)}`` of a lock file, whose every entry must be ``name==version`` and hashed."""
    text = (REPO / name).read_text(encoding="utf-8")
    entries: dict[str, tuple[str, list[str]]] = {}
    for line in re.sub(r"\\\n", " ", text).splitlines():
        requirement = line.split("#", 1)[0].strip()
        if not requirement:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", requirement)
        assert match, f"{name}: not a pinned, hashed requirement: {requirement[:80]}"
        hashes = re.findall(r"sha256:([0-9a-f]{64})", match.group(3))
        entries[canonicalize_name(match.group(1))] = (match.group(2), hashes)
    return entries


def test_every_install_of_the_image_comes_from_a_lock_with_hashes() -> None:
    """The build stage installs Python packages only from the lock files, hash-checked, wheels only; gpu-fence's own
    wheel without dependencies (nothing outside the lock); and pip check fails the build if the lock misses one."""
    build = stages()[0]
    copied = {source for keyword, rest in build if keyword == "COPY" for source in shlex.split(rest)[:-1]}
    assert set(LOCKS) <= copied
    commands = [command.strip() for keyword, rest in build if keyword == "RUN" for command in rest.split("&&")]
    installs = [shlex.split(command) for command in commands if re.search(r"\bpip\b.*\binstall\b", command)]
    assert installs
    locked = []
    for words in installs:
        if "-r" in words:
            assert "--require-hashes" in words and "--only-binary=:all:" in words, words
            locked.append(words[words.index("-r") + 1])
        else:
            assert "--no-deps" in words and all(
                word.startswith(("-", "/wheels/")) or word in ("pip", "install")
                for word in words[words.index("install") + 1 :]
            ), words
    assert sorted(locked) == sorted(LOCKS)
    [wheel] = [shlex.split(command) for command in commands if re.search(r"\bpip wheel\b", command)]
    assert "--no-deps" in wheel and "--no-build-isolation" in wheel  # the locked build backend builds it
    assert any(re.fullmatch(r"pip --python /opt/gpu-fence/bin/python check", command) for command in commands)


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_the_lock_pins_and_hashes_every_package(name: str) -> None:
    entries = _locked(name)
    assert entries
    for package, (version, hashes) in entries.items():
        assert hashes, f"{name}: {package}=={version} has no hash"


def test_the_locks_satisfy_what_pyproject_requires() -> None:
    """A dependency added to pyproject.toml, or a bound raised, without refreshing the locks (sh scripts/lock) fails
    here, before an image build does."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    for name, requirements in (
        ("requirements.lock", project["project"]["dependencies"]),
        ("requirements-build.lock", project["build-system"]["requires"]),
    ):
        entries = _locked(name)
        for text in requirements:
            requirement = Requirement(text)
            package = canonicalize_name(requirement.name)
            assert package in entries, f"{name} has no {package}: run sh scripts/lock"
            assert requirement.specifier.contains(entries[package][0], prereleases=True), (
                f"{name}: {package}=={entries[package][0]} does not satisfy {requirement}: run sh scripts/lock"
            )


def test_the_locks_are_made_for_the_images_python() -> None:
    steps, build = instructions(), stages()[0]
    base = _expanded(build[0][1].split()[0], _arguments(steps[: steps.index(build[0])]))
    python = re.search(r":(\d+\.\d+)\.", base)
    assert python, base
    script = (REPO / "scripts" / "lock").read_text(encoding="utf-8")
    assert f"--python-version {python.group(1)} " in script
    for name in LOCKS:
        assert (
            (REPO / name)
            .read_text(encoding="utf-8")
            .startswith("# This file was autogenerated by uv via the following command:\n#    sh scripts/lock\n")
        )


@pytest.mark.parametrize("lock", ["requirements.lock", "requirements-build.lock"])
def test_an_arm64_build_finds_a_wheel_for_every_locked_package(lock: str, tmp_path: Path) -> None:
    """The release builds linux/arm64 too (GH200 and other Grace nodes): every locked package must have a wheel for
    it with a hash in the lock, or that build's `pip install --only-binary=:all: --require-hashes` fails. pip
    resolves the lock for that platform without installing (it downloads the wheels to check their hashes)."""
    result = run_captured(
        [
            *(sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"),
            *("--target", str(tmp_path / "target"), "--report", str(tmp_path / "report.json")),
            *("--platform", "manylinux_2_28_aarch64", "--platform", "manylinux2014_aarch64"),
            *("--python-version", "3.11", "--implementation", "cp", "--only-binary=:all:", "--require-hashes"),
            *("-r", str(REPO / lock)),
        ],
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    wheels = [item["download_info"]["url"].rsplit("/", 1)[-1] for item in report["install"]]
    assert wheels and all(name.endswith(".whl") for name in wheels)
    assert all("x86_64" not in name for name in wheels), "no wheel of another machine"
