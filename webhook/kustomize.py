"""Directories that are not loose manifests, for the offline ``check``: kustomizations and Helm charts.

A directory that holds a kustomization is an input to kustomize, not a set of objects: its patches are fragments
and its resources may live elsewhere, so reading its files as YAML finds the wrong pod specs or none at all
(``check manifests/overlays/warn-only`` used to print ``0 pod specs``). It is rendered the way ``kubectl apply -k``
renders it, with ``kubectl kustomize``. A Helm chart's templates are Go templates; only ``helm template`` knows the
values that fill them, so the check asks for its output instead of guessing.

The kustomization file names are kustomize's own (``konfig.RecognizedKustomizationFileNames`` in
kubernetes-sigs/kustomize, ``api/konfig/general.go``): ``kustomization.yaml``, ``kustomization.yml`` and
``Kustomization``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Collection

__all__ = [
    "HELM_CHART_FILE",
    "KUSTOMIZATION_FILES",
    "RENDER_TIMEOUT_SECONDS",
    "KustomizeError",
    "helm_chart_message",
    "is_helm_chart",
    "is_kustomization",
    "render",
]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
HELM_CHART_FILE = "Chart.yaml"
#: A kustomization may pull remote bases; a render that takes longer than this is stopped and reported.
RENDER_TIMEOUT_SECONDS = 120.0


class KustomizeError(Exception):
    """A kustomization could not be rendered; the message is one line naming the directory and what to do."""


def is_kustomization(names: Collection[str]) -> bool:
    """True when a directory holding ``names`` (its file names) is a kustomization."""
    return any(name in names for name in KUSTOMIZATION_FILES)


def is_helm_chart(names: Collection[str]) -> bool:
    """True when a directory holding ``names`` is a Helm chart."""
    return HELM_CHART_FILE in names


def helm_chart_message(directory: str) -> str:
    return (
        f"{directory}: a Helm chart ({HELM_CHART_FILE}): its templates are not manifests; render it first: "
        f"helm template {directory} | gpu-fence-webhook check -"
    )


def render(directory: str, *, kubectl: str | None = None, timeout: float = RENDER_TIMEOUT_SECONDS) -> str:
    """The objects ``kubectl kustomize DIRECTORY`` renders, as one YAML stream; raises :class:`KustomizeError`."""
    program = kubectl or shutil.which("kubectl")
    if program is None:
        raise KustomizeError(
            f"{directory}: holds a kustomization, which check renders with kubectl kustomize, but kubectl is not "
            f"on PATH: install kubectl (>= 1.27), or render it yourself: "
            f"kustomize build {directory} | gpu-fence-webhook check -"
        )
    try:
        done = subprocess.run(
            [program, "kustomize", directory],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise KustomizeError(f"{directory}: kubectl kustomize did not finish within {timeout:g} s") from None
    except OSError as error:
        raise KustomizeError(f"{directory}: cannot run {program}: {error.strerror or error}") from None
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        reason = " ".join(said[-1].split()) if said else f"exit status {done.returncode}"
        raise KustomizeError(f"{directory}: kubectl kustomize failed: {reason}")
    try:
        return done.stdout.decode("utf-8")
    except UnicodeDecodeError as error:
        raise KustomizeError(
            f"{directory}: kubectl kustomize wrote text that is not UTF-8 (byte {error.start})"
        ) from None
