"""Properties of the NVML adapter over generated nodes and generated failures, through the fake library."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_fence.auditor.model import ActivityUnknown, NvmlReason
from gpu_fence.auditor.nvml import Nvml, NvmlError, NvmlSnapshot
from tests.fakes.nvml import (
    CONFIG_ENV,
    GIB,
    NVML_RETURN_CODES,
    FakeError,
    FakeGpu,
    FakeMig,
    FakeNvmlConfig,
    FakeProcess,
    fake_functions,
    fake_gpu_uuid,
    fake_mig_uuid,
)

pytest_plugins = ["tests.fakes.nvml.fixtures"]  # the fake_lib fixture

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nvml-properties") / "nvml.conf"


@contextmanager
def configured(config: FakeNvmlConfig, path: Path) -> Iterator[None]:
    """Point the fake at ``config`` for the duration (hypothesis examples cannot use monkeypatch)."""
    config.write(path)
    previous = os.environ.get(CONFIG_ENV)
    os.environ[CONFIG_ENV] = str(path)
    try:
        yield
    finally:
        if previous is None:
            del os.environ[CONFIG_ENV]
        else:
            os.environ[CONFIG_ENV] = previous


@st.composite
def nodes(draw: st.DrawFn) -> FakeNvmlConfig:
    """A node of 0-4 GPUs, some in MIG mode with some occupied slots, and processes of every kind anywhere."""
    gpu_count = draw(st.integers(0, 4))
    gpus, migs, devices = [], [], []
    for index in range(gpu_count):
        mig = draw(st.booleans())
        gpus.append(FakeGpu(index, minor=draw(st.integers(0, 31)), mig=mig))
        if not mig:
            devices.append(fake_gpu_uuid(index))
            continue
        slots = draw(st.lists(st.integers(0, 6), unique=True, max_size=7))
        for position, slot in enumerate(slots):
            migs.append(
                FakeMig(index, slot, gpu_instance_id=1 + position, slices=1 + position % 3, memory_total_bytes=GIB)
            )
            devices.append(fake_mig_uuid(index, slot))
    processes = []
    if devices:
        pids = draw(st.lists(st.integers(1, 4_000_000), unique=True, max_size=25))
        for pid in pids:
            device = draw(st.sampled_from(devices))
            most = GIB if device.startswith("MIG-") else 80 * GIB  # no more than the device has (else: garbage)
            processes.append(
                FakeProcess(
                    device=device,
                    pid=pid,
                    used_memory_bytes=draw(st.none() | st.integers(0, most)),
                    kind=draw(st.sampled_from(["compute", "graphics", "mps"])),
                )
            )
    return FakeNvmlConfig(gpus=tuple(gpus), migs=tuple(migs), processes=tuple(processes))


@given(node=nodes())
@SETTINGS
def test_snapshot_reports_exactly_the_configured_node(fake_lib: Path, config_path: Path, node: FakeNvmlConfig) -> None:
    with configured(node, config_path), Nvml(str(fake_lib)) as nvml:
        snapshot = nvml.snapshot()

    expected_devices = {fake_gpu_uuid(gpu.index) for gpu in node.gpus} | {mig.resolved_uuid() for mig in node.migs}
    assert {device.uuid for device in snapshot.devices} == expected_devices
    assert {(p.pid, p.device_uuid, p.used_memory_bytes, p.kind) for p in snapshot.processes} == {
        (p.pid, str(p.device), p.used_memory_bytes, p.kind) for p in node.processes
    }
    assert snapshot.problems == ()
    minors = {fake_gpu_uuid(gpu.index): gpu.minor for gpu in node.gpus}
    for device in snapshot.devices:
        assert device.minor == minors[device.parent_uuid or device.uuid]
        assert 0 < device.share <= 1
    # Every device's activity is either sampled or unknown with a reason: MIG, or MPS where its MPS list has a process.
    unknown = dict(snapshot.activity_unknown)
    assert set(unknown).isdisjoint(snapshot.activity_devices)
    assert set(unknown) | snapshot.activity_devices == expected_devices
    with_mps = {str(p.device) for p in node.processes if p.kind == "mps"}
    for device in snapshot.devices:
        if device.is_mig or device.mig_enabled:
            assert unknown[device.uuid] is ActivityUnknown.MIG
        elif device.uuid in with_mps:
            assert unknown[device.uuid] is ActivityUnknown.MPS
        else:
            assert device.uuid in snapshot.activity_devices


_CODES = [*sorted(set(NVML_RETURN_CODES.values()) - {0}), 25, 28, 12345]


@st.composite
def failures(draw: st.DrawFn) -> tuple[FakeError, ...]:
    errors = []
    for _ in range(draw(st.integers(1, 4))):
        device = draw(
            st.none() | st.sampled_from([0, 1, 2, fake_gpu_uuid(1), fake_mig_uuid(1, 0), fake_mig_uuid(1, 1)])
        )
        errors.append(
            FakeError(
                function=draw(st.sampled_from([f for f in fake_functions() if f != "nvmlInit_v2"])),
                code=draw(st.sampled_from(_CODES)),
                device=device,
                times=draw(st.none() | st.integers(1, 3)),
            )
        )
    return tuple(errors)


FAILING_NODE = FakeNvmlConfig(
    gpus=(FakeGpu(0), FakeGpu(1, mig=True), FakeGpu(2)),
    migs=(FakeMig(1, 0, gpu_instance_id=1, slices=3), FakeMig(1, 1, gpu_instance_id=2, slices=1)),
    processes=(
        FakeProcess(0, pid=1),
        FakeProcess(fake_mig_uuid(1, 0), pid=2),
        FakeProcess(fake_mig_uuid(1, 1), pid=3, kind="mps"),
        FakeProcess(2, pid=4, kind="graphics", used_memory_bytes=None),
    ),
)


def read_once(lib: Path, config: FakeNvmlConfig, path: Path) -> tuple[bool, NvmlSnapshot | NvmlError]:
    """Open, take one snapshot, close: whether open worked, and the snapshot or the NvmlError raised."""
    nvml = Nvml(str(lib))
    with configured(config, path):
        try:
            nvml.open()
        except NvmlError as error:
            return False, error
        try:
            return True, nvml.snapshot()
        except NvmlError as error:
            return True, error
        finally:
            nvml.close()


@given(errors=failures())
@SETTINGS
def test_no_nvml_error_escapes_whatever_fails(fake_lib: Path, config_path: Path, errors: tuple[FakeError, ...]) -> None:
    """Any call failing with any code, anywhere: open raises NvmlError or works, snapshot returns or raises
    NvmlError, close never raises; every reason is an NvmlReason. Failures confined to other devices never
    cost a healthy GPU its place in the snapshot (once NVML is open: a failed init loses every GPU alike)."""
    opened, outcome = read_once(fake_lib, FAILING_NODE.with_errors(*errors), config_path)
    untouched = all(error.device not in (None, 2) for error in errors)  # GPU 2 itself never fails
    if isinstance(outcome, NvmlError):
        assert isinstance(outcome.reason, NvmlReason)
        if opened:
            assert not untouched, f"one GPU's failure hid the healthy GPU 2: {outcome}"
            assert str(outcome)
    else:
        if untouched:
            assert (4, fake_gpu_uuid(2), None, "graphics") in {
                (p.pid, p.device_uuid, p.used_memory_bytes, p.kind) for p in outcome.processes
            }
        assert all(isinstance(problem.reason, NvmlReason) and problem.message for problem in outcome.problems)
        known = {device.uuid for device in outcome.devices}
        assert all(process.device_uuid in known for process in outcome.processes)
        unknown = dict(outcome.activity_unknown)
        assert set(unknown).isdisjoint(outcome.activity_devices) and set(unknown) | outcome.activity_devices == known
        for device in outcome.devices:
            if device.parent_uuid is not None:
                assert device.parent_uuid in known  # a MIG device never outlives its card
