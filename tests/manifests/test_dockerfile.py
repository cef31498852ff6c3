"""The Dockerfile's build steps work: replay them outside Docker (no engine here) and run both entry points.

The build stage's COPY and RUN instructions are read from the Dockerfile itself and replayed in a temporary
directory that stands for the image's filesystem (absolute paths the stage creates are moved under it), with a
fresh virtual environment standing for the base image's Python. The final stage's COPY --from=build is replayed
too, then ``gpu-fence-webhook --help`` and ``gpu-fence-auditor --help`` run from the copied environment.
This needs PyPI (the wheel's dependencies), as a real image build does; it takes about a minute.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=800,
                check=False,
            )
            assert result.returncode == 0, f"RUN {rest}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    (copy_step,) = [rest for keyword, rest in final if keyword == "COPY"]
    _, source, target = copy_step.split()
    final_root = tmp_path / "final"
    environment = final_root / target.lstrip("/")
    shutil.copytree(Path(_relocate(source, root, created)), environment, symlinks=True)
    assert not (environment / "bin" / "pip").exists(), "no installer in the final environment"
    assert not list(environment.rglob("*.whl")), "no wheel cache in the final environment"
    for program in ("gpu-fence-webhook", "gpu-fence-auditor"):
        result = subprocess.run(
            [str(environment / "bin" / program), "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == 0, result.stderr
        assert "usage:" in result.stdout and "examples:" in result.stdout
