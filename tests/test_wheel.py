"""The built wheel installs one import package, ``gpu_fence``, and nothing under a generic top-level name."""

from __future__ import annotations

import importlib
import zipfile
from pathlib import Path

import pytest

from tests.fakes.wheel import build_wheel

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_only_top_level_name_is_gpu_fence(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [name for name in names if name.endswith(".dist-info/top_level.txt")]
        declared = archive.read(top_level).decode().split()
    installed = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert installed == {"gpu_fence"}
    assert declared == ["gpu_fence"]


def test_the_wheel_holds_both_deployables_chargeback_and_the_proto(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for module in (
        "gpu_fence/vocabulary.py",
        "gpu_fence/webhook/policy/__init__.py",
        "gpu_fence/webhook/policy/rules/privileges.py",
        "gpu_fence/auditor/audit.py",
        "gpu_fence/chargeback/ledger.py",
        "gpu_fence/chargeback/bill.schema.json",
        "gpu_fence/chargeback/demo_fleet.json",
        "gpu_fence/auditor/podresources/v1/api_pb2_grpc.py",
        "gpu_fence/auditor/podresources/v1/api.proto",
    ):
        assert module in names


def test_the_wheel_holds_the_policy_the_manifests_ship(wheel: Path) -> None:
    """check's default policy: webhook/shipped-policy.yaml links to manifests/base/policy.yaml, and the wheel holds
    the file itself, not a link that would point nowhere once installed."""
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read("gpu_fence/webhook/shipped-policy.yaml")
    assert shipped == (REPO / "manifests" / "base" / "policy.yaml").read_bytes()


def test_the_license_is_declared_as_spdx_and_shipped(wheel: Path) -> None:
    """pyproject's SPDX expression and LICENSE file reach the wheel's metadata (PEP 639), and say the same thing as
    the image's org.opencontainers.image.licenses label."""
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode()
        licenses = [name for name in archive.namelist() if name.endswith(".dist-info/licenses/LICENSE")]
        shipped = archive.read(licenses[0]).decode() if licenses else ""
    assert "License-Expression: Apache-2.0" in headers.splitlines()
    assert "License-File: LICENSE" in headers.splitlines()
    license_text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert shipped == license_text
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (REPO / "Dockerfile").read_text(encoding="utf-8")


def test_the_source_folder_names_are_not_importable() -> None:
    for name in ("webhook", "auditor.audit", "chargeback.ledger"):
        with pytest.raises(ModuleNotFoundError, match="import gpu_fence"):
            importlib.import_module(name)
    assert importlib.import_module("gpu_fence.webhook.policy").__name__ == "gpu_fence.webhook.policy"
