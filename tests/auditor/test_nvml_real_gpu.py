"""The NVML adapter against a real driver, on machines that have one (GPU runners); elsewhere these are skipped.

The fake reproduces nvml.h's conventions; these checks confirm the ones the fake cannot prove (see the last
section of docs/nvml.md). Run in a fresh interpreter, because a process that loaded the fake library would keep
answering the bare name ``libnvidia-ml.so.1`` with it.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import sys
from pathlib import Path

import pytest

from tests.fakes.processes import run_captured

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is None and not os.environ.get("GPU_FENCE_NVML_LIB"),
    reason="no NVIDIA driver on this machine (set GPU_FENCE_NVML_LIB to point at libnvidia-ml.so.1)",
)

_SNAPSHOT = """
import json, os, sys
from dataclasses import asdict
from gpu_fence.auditor.nvml import Nvml
with Nvml(os.environ.get("GPU_FENCE_NVML_LIB") or None) as nvml:
    snapshot = nvml.snapshot()
json.dump(asdict(snapshot), sys.stdout)
"""


def real_snapshot() -> dict:
    result = run_captured([sys.executable, "-c", _SNAPSHOT], timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_real_driver_snapshot_is_consistent() -> None:
    snapshot = real_snapshot()
    devices = {device["uuid"]: device for device in snapshot["devices"]}

    assert devices, "NVML answered but listed no GPU"
    assert snapshot["driver_version"]
    for device in devices.values():
        if device["parent_uuid"] is None:
            assert device["uuid"].startswith("GPU-")
            assert device["memory_total_bytes"] > 0
            if device["minor"] is not None:
                assert os.path.exists(f"/dev/nvidia{device['minor']}")
        else:
            assert device["uuid"].startswith("MIG-")
            assert devices[device["parent_uuid"]]["mig_enabled"]
            assert 0 < device["share"] <= 1
    for process in snapshot["processes"]:
        assert process["device_uuid"] in devices
        assert process["kind"] in {"compute", "graphics", "mps"}
    for problem in snapshot["problems"]:
        print("NVML problem:", problem)  # visible with -s on a GPU runner; a problem is not a failure here
