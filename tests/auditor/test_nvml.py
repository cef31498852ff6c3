"""The NVML adapter against the fake libnvidia-ml.so.1, loaded by the real pynvml through ``Nvml(lib_path=...)``:
devices, processes and their memory, errors, and per-process activity."""

from __future__ import annotations

import ctypes.util
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpu_fence.auditor.model import IDLE, Activity, ActivityUnknown, Gpu, NvmlReason
from gpu_fence.auditor.nvml import NO_INSTANCE, Nvml, NvmlError, NvmlSnapshot
from tests.fakes.nvml import (
    CONFIG_ENV,
    GIB,
    FakeError,
    FakeGpu,
    FakeMig,
    FakeMpsServer,
    FakeNvmlClock,
    FakeNvmlConfig,
    FakeNvmlCounters,
    FakeProcess,
    FakeUtilSample,
    environment,
    fake_gpu_uuid,
    fake_mig_uuid,
    mig_node,
)
from tests.fakes.processes import run_captured

if TYPE_CHECKING:  # imported by pytest_plugins, as a plugin, before anything else may import it
    from tests.fakes.nvml.fixtures import OpenNvml

pytest_plugins = ["tests.fakes.nvml.fixtures"]  # the fake_lib and open_nvml fixtures

REPO = Path(__file__).resolve().parents[2]

GPU0, GPU1, GPU2 = fake_gpu_uuid(0), fake_gpu_uuid(1), fake_gpu_uuid(2)
MIG10, MIG11, MIG12 = fake_mig_uuid(1, 0), fake_mig_uuid(1, 1), fake_mig_uuid(1, 2)

#: Two whole GPUs around one H100 in MIG mode with a 3g, a 2g and a 1g slice (slots 0..2).
MIXED_NODE = FakeNvmlConfig(
    gpus=(
        FakeGpu(0, minor=3),
        FakeGpu(1, minor=0, mig=True),
        FakeGpu(2, minor=7, name="NVIDIA A100-SXM4-40GB", memory_total_bytes=40 * GIB),
    ),
    migs=(
        FakeMig(1, 0, gpu_instance_id=2, compute_instance_id=0, slices=3, memory_total_bytes=40 * GIB),
        FakeMig(1, 1, gpu_instance_id=3, compute_instance_id=0, slices=2, memory_total_bytes=20 * GIB),
        FakeMig(1, 2, gpu_instance_id=9, compute_instance_id=0, slices=1, memory_total_bytes=10 * GIB),
    ),
)


def by_uuid(snapshot: NvmlSnapshot) -> dict:
    return {device.uuid: device for device in snapshot.devices}


def process_set(snapshot: NvmlSnapshot) -> set[tuple[int, str, int | None, str]]:
    return {(p.pid, p.device_uuid, p.used_memory_bytes, p.kind) for p in snapshot.processes}


# ---- devices -------------------------------------------------------------------------------------------------


def test_lists_whole_gpus_with_index_minor_name_and_memory(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(MIXED_NODE).snapshot()

    assert all(type(device) is Gpu for device in snapshot.devices)  # the model's value, for the join as it is
    gpu0, gpu2 = by_uuid(snapshot)[GPU0], by_uuid(snapshot)[GPU2]
    assert (gpu0.index, gpu0.minor, gpu0.model, gpu0.memory_total_bytes) == (0, 3, "NVIDIA H100 80GB HBM3", 80 * GIB)
    assert (gpu2.index, gpu2.minor, gpu2.model, gpu2.memory_total_bytes) == (2, 7, "NVIDIA A100-SXM4-40GB", 40 * GIB)
    assert not gpu0.mig_enabled and not gpu0.is_mig and gpu0.share == 1.0 and gpu0.parent_uuid is None
    assert snapshot.problems == ()
    assert snapshot.driver_version == "550.163.01"


def test_devices_come_in_index_order_with_each_mig_device_after_its_card(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(MIXED_NODE).snapshot()

    assert [device.uuid for device in snapshot.devices] == [GPU0, GPU1, MIG10, MIG11, MIG12, GPU2]


def test_mig_devices_carry_parent_instance_ids_share_and_profile(open_nvml: OpenNvml) -> None:
    devices = by_uuid(open_nvml(MIXED_NODE).snapshot())

    assert devices[GPU1].mig_enabled and devices[GPU1].share == 1.0
    three, two, one = devices[MIG10], devices[MIG11], devices[MIG12]
    assert (three.parent_uuid, three.index, three.minor, three.mig_index) == (GPU1, 1, 0, 0)
    assert (three.gpu_instance_id, three.compute_instance_id) == (2, 0)
    assert (one.gpu_instance_id, one.mig_index) == (9, 2)
    assert [three.share, two.share, one.share] == pytest.approx([3 / 7, 2 / 7, 1 / 7])
    assert [three.profile, two.profile, one.profile] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    assert three.model == "NVIDIA H100 80GB HBM3"  # the card's model; the slice is the profile
    assert three.memory_total_bytes == 40 * GIB and three.is_mig and not three.mig_enabled


def test_share_uses_the_cards_own_slice_count(open_nvml: OpenNvml) -> None:
    """An A30 has 4 slices: a 2-slice instance is half the card, not 2/7."""
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0, name="NVIDIA A30", memory_total_bytes=24 * GIB, mig=True, max_slices=4),),
        migs=(FakeMig(0, 0, gpu_instance_id=1, slices=2, memory_total_bytes=12 * GIB),),
    )
    mig = by_uuid(open_nvml(config).snapshot())[fake_mig_uuid(0, 0)]

    assert mig.share == pytest.approx(0.5)
    assert mig.profile == "2g.12gb"


def test_share_falls_back_to_memory_when_slice_counts_are_unavailable(open_nvml: OpenNvml) -> None:
    config = MIXED_NODE.with_errors(
        FakeError("nvmlDeviceGetGpuInstanceProfileInfoV", "NOT_SUPPORTED"),
    )
    snapshot = open_nvml(config).snapshot()

    assert by_uuid(snapshot)[MIG10].share == pytest.approx(0.5)  # 40 of 80 GiB
    assert snapshot.problems == ()


def test_mig_device_without_a_name_suffix_has_no_profile(open_nvml: OpenNvml) -> None:
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0, mig=True),),
        migs=(FakeMig(0, 0, gpu_instance_id=1, name="Some Future GPU"),),
    )
    mig = open_nvml(config).snapshot().devices[1]

    assert mig.profile == ""
    assert mig.model == "NVIDIA H100 80GB HBM3"


def test_node_without_gpus_is_an_empty_snapshot(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(FakeNvmlConfig()).snapshot()

    assert snapshot.devices == () and snapshot.processes == () and snapshot.problems == ()


def test_unsupported_minor_number_and_mig_mode_are_not_problems(open_nvml: OpenNvml) -> None:
    """Pre-Ampere cards have no MIG mode; some platforms report no minor number. Neither is a fault."""
    config = MIXED_NODE.with_errors(
        FakeError("nvmlDeviceGetMinorNumber", "NOT_SUPPORTED", device=0),
        FakeError("nvmlDeviceGetMigMode", "NOT_SUPPORTED", device=2),
    )
    snapshot = open_nvml(config).snapshot()

    assert by_uuid(snapshot)[GPU0].minor is None
    assert not by_uuid(snapshot)[GPU2].mig_enabled
    assert snapshot.problems == ()


def test_unreadable_name_or_memory_keeps_the_gpu_and_says_so(open_nvml: OpenNvml) -> None:
    config = MIXED_NODE.with_errors(
        FakeError("nvmlDeviceGetMemoryInfo", "UNKNOWN", device=GPU2),
        FakeError("nvmlDeviceGetName", "NO_PERMISSION", device=GPU0),
    )
    snapshot = open_nvml(config).snapshot()

    assert by_uuid(snapshot)[GPU2].memory_total_bytes is None  # unknown, never 0
    assert by_uuid(snapshot)[GPU0].model == ""
    assert {(p.device, p.reason) for p in snapshot.problems} == {(GPU2, "unknown"), (GPU0, "no-permission")}
    assert any("memory" in p.message for p in snapshot.problems)


# ---- processes -----------------------------------------------------------------------------------------------


def test_processes_of_every_kind_on_a_whole_gpu(open_nvml: OpenNvml) -> None:
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0), FakeGpu(1)),
        processes=(
            FakeProcess(0, pid=100, used_memory_bytes=3 * GIB),
            FakeProcess(0, pid=101, used_memory_bytes=None, kind="graphics"),
            FakeProcess(GPU1, pid=102, used_memory_bytes=512 << 20, kind="mps"),
            FakeProcess(GPU1, pid=103, used_memory_bytes=0),
        ),
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {
        (100, GPU0, 3 * GIB, "compute"),
        (101, GPU0, None, "graphics"),  # NVML_VALUE_NOT_AVAILABLE
        (102, GPU1, 512 << 20, "mps"),
        (103, GPU1, 0, "compute"),
    }
    assert snapshot.problems == ()


def test_processes_in_mig_devices_are_attributed_to_the_mig_device(open_nvml: OpenNvml) -> None:
    config = MIXED_NODE.running(
        FakeProcess(MIG10, pid=200, used_memory_bytes=5 * GIB),
        FakeProcess(MIG10, pid=201, used_memory_bytes=None),
        FakeProcess(MIG12, pid=202, used_memory_bytes=GIB, kind="mps"),
        FakeProcess(0, pid=300, used_memory_bytes=GIB),
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {
        (200, MIG10, 5 * GIB, "compute"),
        (201, MIG10, None, "compute"),
        (202, MIG12, GIB, "mps"),
        (300, GPU0, GIB, "compute"),
    }
    assert snapshot.problems == ()


def test_parent_aggregate_denied_still_reads_mig_device_handles(open_nvml: OpenNvml) -> None:
    """nvml.h: the parent handle gives the aggregate only to privileged callers; per-instance lists still work."""
    config = MIXED_NODE.running(FakeProcess(MIG11, pid=210, used_memory_bytes=GIB)).with_errors(
        *(
            FakeError(function, "NO_PERMISSION", device=GPU1)
            for function in (
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetGraphicsRunningProcesses_v3",
                "nvmlDeviceGetMPSComputeRunningProcesses_v3",
            )
        )
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {(210, MIG11, GIB, "compute")}
    assert snapshot.problems == ()


def test_a_process_list_nvml_cannot_read_makes_that_device_unlisted_not_empty(open_nvml: OpenNvml) -> None:
    """NOT_SUPPORTED means the device keeps no such list (known: none); any other error leaves its processes
    unknown, and the snapshot says which device and why, so that nothing downstream reads it as zero."""
    config = MIXED_NODE.running(FakeProcess(0, pid=300, used_memory_bytes=GIB)).with_errors(
        FakeError("nvmlDeviceGetGraphicsRunningProcesses_v3", "NO_PERMISSION", device=GPU0),
        FakeError("nvmlDeviceGetComputeRunningProcesses_v3", "NOT_SUPPORTED", device=GPU2),
    )
    snapshot = open_nvml(config).snapshot()

    assert snapshot.unlisted == ((GPU0, "no-permission"),)
    assert (300, GPU0, GIB, "compute") in process_set(snapshot)  # what did come back is kept
    assert any(p.device == GPU0 and "graphics" in p.message for p in snapshot.problems)


def test_parent_view_alone_attributes_by_gpu_and_compute_instance_ids(open_nvml: OpenNvml) -> None:
    """When the MIG handles list nothing, the parent's gpuInstanceId/computeInstanceId place each process."""
    config = MIXED_NODE.running(
        FakeProcess(1, pid=220, used_memory_bytes=GIB, gpu_instance_id=3, compute_instance_id=0),
        FakeProcess(1, pid=221, used_memory_bytes=2 * GIB, gpu_instance_id=9, compute_instance_id=0),
    ).with_errors(
        *(
            FakeError("nvmlDeviceGetComputeRunningProcesses_v3", "NOT_SUPPORTED", device=mig)
            for mig in (MIG10, MIG11, MIG12)
        )
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {(220, MIG11, GIB, "compute"), (221, MIG12, 2 * GIB, "compute")}


def test_parent_view_places_an_unknown_compute_instance_by_its_gpu_instance(open_nvml: OpenNvml) -> None:
    """A GPU instance with one MIG device is unambiguous even when the compute instance id is not one we know."""
    config = MIXED_NODE.running(
        FakeProcess(1, pid=225, used_memory_bytes=GIB, gpu_instance_id=3, compute_instance_id=5)
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {(225, MIG11, GIB, "compute")}
    assert snapshot.problems == ()


def test_process_seen_by_parent_and_mig_handle_is_listed_once(fake_lib: Path, open_nvml: OpenNvml) -> None:
    config = MIXED_NODE.running(FakeProcess(MIG10, pid=230, used_memory_bytes=7 * GIB))
    counters = FakeNvmlCounters(fake_lib)
    counters.reset()
    snapshot = open_nvml(config).snapshot()

    assert [(p.pid, p.device_uuid, p.used_memory_bytes) for p in snapshot.processes] == [(230, MIG10, 7 * GIB)]
    # Both views were really asked: the parent's aggregate and the MIG device's own list.
    assert counters.results("nvmlDeviceGetComputeRunningProcesses_v3", "INSUFFICIENT_SIZE") == 2


def test_process_in_no_known_mig_device_counts_on_the_card_with_a_problem(open_nvml: OpenNvml) -> None:
    config = MIXED_NODE.running(
        FakeProcess(1, pid=240, used_memory_bytes=GIB, gpu_instance_id=13, compute_instance_id=0)
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {(240, GPU1, GIB, "compute")}
    [problem] = snapshot.problems
    assert problem.device == GPU1 and "240" in problem.message and "GPU instance 13" in problem.message


def test_process_in_several_lists_of_one_device_is_one_entry(open_nvml: OpenNvml) -> None:
    """nvidia-smi's C+G and M+C: one process in two lists of a device. usedGpuMemory is the process's whole memory
    on the device in each list, so adding the lists would bill it twice."""
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0), FakeGpu(1)),
        processes=(
            FakeProcess(0, pid=260, used_memory_bytes=2 * GIB),
            FakeProcess(0, pid=260, used_memory_bytes=2 * GIB, kind="graphics"),
            FakeProcess(GPU1, pid=261, used_memory_bytes=None),
            FakeProcess(GPU1, pid=261, used_memory_bytes=GIB, kind="mps"),
        ),
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {(260, GPU0, 2 * GIB, "compute+graphics"), (261, GPU1, GIB, "compute+mps")}


def test_process_of_a_mig_device_with_odd_ids_in_the_parent_view_is_not_counted_twice(open_nvml: OpenNvml) -> None:
    """The MIG handle already placed the process; the parent's aggregate entry with ids that match no MIG device
    is the same memory, not a second process on the whole card."""
    config = MIXED_NODE.running(
        FakeProcess(MIG10, pid=262, used_memory_bytes=GIB, gpu_instance_id=13, compute_instance_id=0)
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {(262, MIG10, GIB, "compute")}
    assert snapshot.problems == ()


def test_a_process_size_larger_than_its_device_is_unknown_with_a_problem(open_nvml: OpenNvml) -> None:
    """A reading past the device's memory is garbage (a driver bug, a torn read): billing it would put exabytes on
    one container, so it counts as unknown and says so."""
    config = MIXED_NODE.running(
        FakeProcess(0, pid=270, used_memory_bytes=2**63),
        FakeProcess(MIG12, pid=271, used_memory_bytes=11 * GIB),  # a 10 GiB slice
        FakeProcess(0, pid=272, used_memory_bytes=80 * GIB),  # the whole card: fine
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {
        (270, GPU0, None, "compute"),
        (271, MIG12, None, "compute"),
        (272, GPU0, 80 * GIB, "compute"),
    }
    assert {(p.device, p.reason) for p in snapshot.problems} == {(GPU0, "unknown"), (MIG12, "unknown")}
    assert any("270" in p.message and "more than" in p.message for p in snapshot.problems)


def test_instance_ids_are_none_on_gpus_without_mig(fake_lib: Path, open_nvml: OpenNvml) -> None:
    """nvml.h: 0xFFFFFFFF without MIG; the adapter must not read that as a GPU instance id."""
    config = FakeNvmlConfig(gpus=(FakeGpu(0),), processes=(FakeProcess(0, pid=250, gpu_instance_id=1),))
    open_nvml(config)
    import pynvml

    raw = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert [(p.gpuInstanceId, p.computeInstanceId) for p in raw] == [(NO_INSTANCE, NO_INSTANCE)]


def test_pynvml_size_protocol_is_exercised(fake_lib: Path, open_nvml: OpenNvml) -> None:
    """pynvml probes with a count of 0 and NULL, gets INSUFFICIENT_SIZE and the count, then reads; with no
    processes the probe itself answers SUCCESS. The fake counts both outcomes."""
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0), FakeGpu(1)),
        processes=tuple(FakeProcess(0, pid=pid) for pid in range(400, 450)),
    )
    counters = FakeNvmlCounters(fake_lib)
    counters.reset()
    snapshot = open_nvml(config).snapshot()

    assert len(snapshot.processes) == 50
    compute = "nvmlDeviceGetComputeRunningProcesses_v3"
    assert counters.results(compute, "INSUFFICIENT_SIZE") == 1  # GPU 0's probe
    assert counters.results(compute, "SUCCESS") == 2  # GPU 0's read, GPU 1's empty probe
    assert counters.calls(compute) == 3
    assert counters.calls("nvmlDeviceGetComputeRunningProcesses_v2") == 0


def test_list_that_outgrows_the_buffer_between_calls_is_asked_again(fake_lib: Path, open_nvml: OpenNvml) -> None:
    """A list can grow past pynvml's 2n+5 buffer between its two calls; NVML then says INSUFFICIENT_SIZE again."""
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0),),
        processes=(FakeProcess(0, pid=500),),
        errors=(FakeError("nvmlDeviceGetComputeRunningProcesses_v3", "INSUFFICIENT_SIZE", times=2),),
    )
    counters = FakeNvmlCounters(fake_lib)
    counters.reset()
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {(500, GPU0, GIB, "compute")}
    assert snapshot.problems == ()
    assert counters.results("nvmlDeviceGetComputeRunningProcesses_v3", "INSUFFICIENT_SIZE") == 3


def test_list_that_never_fits_is_a_problem_not_an_exception(open_nvml: OpenNvml) -> None:
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0),),
        processes=(FakeProcess(0, pid=510),),
        errors=(FakeError("nvmlDeviceGetComputeRunningProcesses_v3", "INSUFFICIENT_SIZE"),),
    )
    snapshot = open_nvml(config).snapshot()

    assert [device.uuid for device in snapshot.devices] == [GPU0]
    assert snapshot.processes == ()
    [problem] = snapshot.problems
    assert problem.device == GPU0
    assert problem.message == "could not list compute processes: Insufficient Size"


def test_driver_without_v3_process_calls_falls_back_to_v2(fake_lib: Path, open_nvml: OpenNvml) -> None:
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0),),
        processes=(FakeProcess(0, pid=600, used_memory_bytes=2 * GIB),),
        errors=(FakeError("nvmlDeviceGetComputeRunningProcesses_v3", "FUNCTION_NOT_FOUND"),),
    )
    counters = FakeNvmlCounters(fake_lib)
    counters.reset()
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {(600, GPU0, 2 * GIB, "compute")}
    assert counters.results("nvmlDeviceGetComputeRunningProcesses_v2", "INSUFFICIENT_SIZE") == 1
    assert snapshot.problems == ()


def test_unsupported_process_lists_mean_no_processes_not_problems(open_nvml: OpenNvml) -> None:
    """Graphics on a compute card and MPS before Volta answer NOT_SUPPORTED."""
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0),),
        processes=(FakeProcess(0, pid=700),),
        errors=(
            FakeError("nvmlDeviceGetGraphicsRunningProcesses_v3", "NOT_SUPPORTED"),
            FakeError("nvmlDeviceGetMPSComputeRunningProcesses_v3", "NOT_SUPPORTED"),
        ),
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {(700, GPU0, GIB, "compute")}
    assert snapshot.problems == ()


def test_other_process_list_failures_are_problems_on_that_device(open_nvml: OpenNvml) -> None:
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0), FakeGpu(1)),
        processes=(FakeProcess(0, pid=710), FakeProcess(1, pid=711)),
        errors=(FakeError("nvmlDeviceGetComputeRunningProcesses_v3", "NO_PERMISSION", device=GPU0),),
    )
    snapshot = open_nvml(config).snapshot()

    assert process_set(snapshot) == {(711, GPU1, GIB, "compute")}
    [problem] = snapshot.problems
    assert (problem.device, problem.reason) == (GPU0, "no-permission")
    assert "privileged" in problem.message


def test_dense_node_every_process_on_its_slice(open_nvml: OpenNvml) -> None:
    """The benchmark's node: 8 GPUs × 7 MIG slices, 36 processes per slice (2,016)."""
    config = mig_node(8, 7, 36)
    snapshot = open_nvml(config).snapshot()

    assert len(snapshot.devices) == 8 + 56
    assert len(snapshot.processes) == 2016
    expected = {(p.pid, str(p.device), p.used_memory_bytes, "compute") for p in config.processes}
    assert process_set(snapshot) == expected
    assert snapshot.problems == ()


# ---- a lost GPU, and everything else that goes wrong per device -----------------------------------------------


def test_gpu_lost_on_one_device_is_a_problem_and_the_others_are_reported(open_nvml: OpenNvml) -> None:
    config = FakeNvmlConfig(
        gpus=MIXED_NODE.gpus,
        processes=(FakeProcess(0, pid=800), FakeProcess(2, pid=802)),
        errors=(FakeError("nvmlDeviceGetUUID", "GPU_IS_LOST", device=1),),
    )
    snapshot = open_nvml(config).snapshot()

    assert [device.uuid for device in snapshot.devices] == [GPU0, GPU2]
    assert process_set(snapshot) == {(800, GPU0, GIB, "compute"), (802, GPU2, GIB, "compute")}
    [problem] = snapshot.problems
    assert (problem.device, problem.reason) == (None, "gpu-lost")
    assert "GPU 1" in problem.message and "drain the node" in problem.message


def test_gpu_lost_while_listing_processes_drops_that_whole_card(open_nvml: OpenNvml) -> None:
    """A card that is lost mid-read is not half-reported: its MIG devices and processes go with it."""
    config = MIXED_NODE.running(FakeProcess(MIG10, pid=810), FakeProcess(0, pid=811)).with_errors(
        FakeError("nvmlDeviceGetMPSComputeRunningProcesses_v3", "GPU_IS_LOST", device=MIG12)
    )
    snapshot = open_nvml(config).snapshot()

    assert [device.uuid for device in snapshot.devices] == [GPU0, GPU2]
    assert process_set(snapshot) == {(811, GPU0, GIB, "compute")}
    [problem] = snapshot.problems
    assert (problem.device, problem.reason) == (GPU1, "gpu-lost")


def test_unreadable_mig_device_is_left_out_and_its_siblings_kept(open_nvml: OpenNvml) -> None:
    config = MIXED_NODE.with_errors(FakeError("nvmlDeviceGetGpuInstanceId", "UNKNOWN", device=MIG11))
    snapshot = open_nvml(config).snapshot()

    assert [device.uuid for device in snapshot.devices] == [GPU0, GPU1, MIG10, MIG12, GPU2]
    [problem] = snapshot.problems
    assert problem.device == MIG11
    assert (
        problem.message == "MIG device 1 left out of this snapshot: could not read its GPU instance id: Unknown Error"
    )


def test_handle_failure_on_one_gpu_names_its_index(open_nvml: OpenNvml) -> None:
    config = MIXED_NODE.with_errors(FakeError("nvmlDeviceGetHandleByIndex_v2", "NO_PERMISSION", device=2))
    snapshot = open_nvml(config).snapshot()

    assert [device.uuid for device in snapshot.devices] == [GPU0, GPU1, MIG10, MIG11, MIG12]
    [problem] = snapshot.problems
    assert (problem.device, problem.reason) == (None, "no-permission")
    assert problem.message.startswith("GPU 2 left out of this snapshot: could not get its handle: Insufficient Perm")


def test_nothing_readable_at_all_raises(open_nvml: OpenNvml) -> None:
    config = MIXED_NODE.with_errors(FakeError("nvmlDeviceGetUUID", "GPU_IS_LOST"))
    nvml = open_nvml(config)

    with pytest.raises(NvmlError) as raised:
        nvml.snapshot()
    assert raised.value.reason == "gpu-lost"
    assert "none of the 3 GPUs could be read" in str(raised.value)


def test_device_count_failure_raises(open_nvml: OpenNvml) -> None:
    nvml = open_nvml(MIXED_NODE.with_errors(FakeError("nvmlDeviceGetCount_v2", "UNKNOWN")))

    with pytest.raises(NvmlError, match="cannot count the GPUs") as raised:
        nvml.snapshot()
    assert raised.value.reason == "unknown"


# ---- opening and closing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("DRIVER_NOT_LOADED", ("driver-not-loaded", "kernel driver")),
        ("NO_PERMISSION", ("no-permission", "privileged")),
        ("LIB_RM_VERSION_MISMATCH", ("unknown", "initialisation failed")),
        ("UNKNOWN", ("unknown", "initialisation failed")),
    ],
)
def test_init_failure_is_an_nvml_error_with_a_reason(
    fake_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str, expected: tuple[str, str]
) -> None:
    reason, hint = expected
    config = MIXED_NODE.with_errors(FakeError("nvmlInitWithFlags", code))
    monkeypatch.setenv(CONFIG_ENV, str(config.write(tmp_path / "nvml.conf")))
    nvml = Nvml(str(fake_lib))

    with pytest.raises(NvmlError) as raised:
        nvml.open()
    assert raised.value.reason == reason
    assert hint in str(raised.value)
    assert isinstance(raised.value.reason, NvmlReason)
    nvml.close()  # closing what never opened is harmless


def test_init_failure_does_not_block_a_later_open(
    fake_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = MIXED_NODE.with_errors(FakeError("nvmlInitWithFlags", "DRIVER_NOT_LOADED", times=1))
    monkeypatch.setenv(CONFIG_ENV, str(config.write(tmp_path / "nvml.conf")))
    with pytest.raises(NvmlError):
        Nvml(str(fake_lib)).open()
    monkeypatch.setenv(CONFIG_ENV, str(MIXED_NODE.write(tmp_path / "ok.conf")))

    with Nvml(str(fake_lib)) as nvml:
        assert len(nvml.snapshot().devices) == 6


def test_library_path_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "libnvidia-ml.so.1"

    with pytest.raises(NvmlError) as raised:
        Nvml(str(missing)).open()
    assert raised.value.reason == "library-missing"
    message = str(raised.value)
    assert str(missing) in message and "--nvml-lib" in message and "/run/nvidia/driver" in message


def test_library_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(NvmlError, match=r"is a directory; give the library file in it") as raised:
        Nvml(str(tmp_path)).open()
    assert raised.value.reason == "library-missing"


def test_library_that_is_not_nvml() -> None:
    libc = ctypes.util.find_library("c")
    assert libc is not None

    with pytest.raises(NvmlError, match="does not export nvmlInitWithFlags") as raised:
        Nvml(libc).open()
    assert raised.value.reason == "library-missing"


def test_reopening_reads_another_config(fake_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = Nvml(str(fake_lib))
    monkeypatch.setenv(CONFIG_ENV, str(FakeNvmlConfig(gpus=(FakeGpu(0),)).write(tmp_path / "a.conf")))
    with nvml:
        assert [device.uuid for device in nvml.snapshot().devices] == [GPU0]
    monkeypatch.setenv(CONFIG_ENV, str(MIXED_NODE.write(tmp_path / "b.conf")))
    with nvml:
        assert len(nvml.snapshot().devices) == 6


def test_reopening_with_another_library_path(fake_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pynvml holds one library per process; after close, Nvml can bind it to a different file."""
    other = tmp_path / "driver" / "usr" / "lib64" / "libnvidia-ml.so.1"
    other.parent.mkdir(parents=True)
    shutil.copy(fake_lib, other)
    monkeypatch.setenv(CONFIG_ENV, str(MIXED_NODE.write(tmp_path / "nvml.conf")))
    first, second = FakeNvmlCounters(fake_lib), FakeNvmlCounters(other)
    first.reset()
    second.reset()

    with Nvml(str(other)) as nvml:
        assert len(nvml.snapshot().devices) == 6
    with Nvml(str(fake_lib)) as nvml:
        assert len(nvml.snapshot().devices) == 6

    # Each library file was really loaded and asked once: two distinct copies, not one reused.
    assert first.calls("nvmlDeviceGetCount_v2") == 1
    assert second.calls("nvmlDeviceGetCount_v2") == 1


def test_second_library_while_one_is_open_is_refused(fake_lib: Path, tmp_path: Path, open_nvml: OpenNvml) -> None:
    open_nvml(MIXED_NODE)
    other = tmp_path / "other" / "libnvidia-ml.so.1"
    other.parent.mkdir()
    shutil.copy(fake_lib, other)

    with pytest.raises(NvmlError, match="close the other Nvml first"):
        Nvml(str(other)).open()


def test_two_instances_of_the_same_library_share_it(fake_lib: Path, open_nvml: OpenNvml) -> None:
    first = open_nvml(MIXED_NODE)
    second = Nvml(str(fake_lib))
    second.open()
    second.close()

    assert len(first.snapshot().devices) == 6  # NVML counts inits: the other's shutdown left this one open


def test_snapshot_before_open_or_after_close(fake_lib: Path, open_nvml: OpenNvml) -> None:
    with pytest.raises(NvmlError, match="not open"):
        Nvml(str(fake_lib)).snapshot()
    nvml = open_nvml(MIXED_NODE)
    nvml.close()
    nvml.close()
    with pytest.raises(NvmlError, match="not open"):
        nvml.snapshot()


def test_failed_shutdown_is_not_raised(open_nvml: OpenNvml) -> None:
    nvml = open_nvml(MIXED_NODE.with_errors(FakeError("nvmlShutdown", "UNKNOWN")))
    nvml.close()
    nvml.close()


# ---- the default library (no --nvml-lib) needs a fresh process: glibc keeps the first soname it loaded ------

_DEFAULT_OPEN = """
import sys
from gpu_fence.auditor.nvml import Nvml, NvmlError
try:
    with Nvml() as nvml:
        print(len(nvml.snapshot().devices))
except NvmlError as error:
    print(error.reason, error, sep="|")
"""


def _run_default(env: dict[str, str]) -> str:
    result = run_captured([sys.executable, "-c", _DEFAULT_OPEN], timeout=60, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_default_library_is_found_on_the_library_path(fake_lib: Path, tmp_path: Path) -> None:
    env = environment(MIXED_NODE.write(tmp_path / "nvml.conf"))
    env["LD_LIBRARY_PATH"] = str(fake_lib.parent)

    assert _run_default(env) == "6"


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has a real NVML")
def test_default_library_missing_says_how_to_point_at_it(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}

    reason, message = _run_default(env).split("|", 1)
    assert reason == "library-missing"
    assert "libnvidia-ml.so.1 was not found" in message and "--nvml-lib" in message


def test_docs_explain_every_reason() -> None:
    text = (REPO / "docs" / "nvml.md").read_text()

    assert all(f"`{reason}`" in text for reason in NvmlReason)


# ---- per-process activity: NVML's utilisation samples (docs/nvml.md, "Per-process utilisation") ----------------
# What the adapter must get right: the versioned call first and the older one where the driver lacks it; only
# samples newer than the previous snapshot's; NOT_FOUND as "all idle"; nothing at all on a MIG-enabled card; and
# every failure a problem or a silence, never an exception.

NEW_CALL, OLD_CALL = "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"

#: A whole H100 with three processes (two sampled) beside an H100 in MIG mode with a process in its slice.
SAMPLED_NODE = FakeNvmlConfig(
    gpus=(FakeGpu(0), FakeGpu(1, mig=True)),
    migs=(FakeMig(1, 0, gpu_instance_id=5),),
    processes=(
        FakeProcess(0, pid=11),
        FakeProcess(0, pid=12),
        FakeProcess(0, pid=13),
        FakeProcess(MIG10, pid=21),
    ),
    samples=(
        FakeUtilSample(0, pid=11, sm=40, memory=10, encoder=2, decoder=4, at=1_000),
        FakeUtilSample(0, pid=12, sm=90, memory=50, at=2_000),
        FakeUtilSample(MIG10, pid=21, sm=70, at=2_000),
    ),
)


def activity(snapshot: NvmlSnapshot) -> dict[tuple[int, str], Activity | None]:
    return {(process.pid, process.device_uuid): process.activity for process in snapshot.processes}


def test_each_process_gets_its_samples_as_shares_of_time(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(SAMPLED_NODE).snapshot()

    found = activity(snapshot)
    assert found[(11, GPU0)] == Activity(sm=0.40, memory_controller=0.10, encoder=0.02, decoder=0.04)
    assert found[(12, GPU0)] == Activity(sm=0.90, memory_controller=0.50)
    assert found[(13, GPU0)] == IDLE  # NVML returns samples only for processes with non-zero utilisation
    assert snapshot.activity_devices == frozenset({GPU0})
    assert snapshot.problems == ()


def test_a_mig_enabled_card_is_not_asked_and_its_activity_is_unknown(fake_lib: Path, open_nvml: OpenNvml) -> None:
    """nvml.h: "On MIG-enabled GPUs, querying process utilization is not currently supported"."""
    counters = FakeNvmlCounters(fake_lib)
    nvml = open_nvml(SAMPLED_NODE)
    counters.reset()
    snapshot = nvml.snapshot()

    assert activity(snapshot)[(21, MIG10)] is None
    assert GPU1 not in snapshot.activity_devices and MIG10 not in snapshot.activity_devices
    assert counters.calls(NEW_CALL) == 2  # pynvml's probe and read, on GPU 0 only
    assert counters.results(NEW_CALL, "NOT_SUPPORTED") == counters.calls(OLD_CALL) == 0


def test_the_next_snapshot_reads_only_samples_newer_than_the_last_one(fake_lib: Path, open_nvml: OpenNvml) -> None:
    counters = FakeNvmlCounters(fake_lib)
    nvml = open_nvml(SAMPLED_NODE)
    nvml.snapshot()
    counters.reset()

    again = nvml.snapshot()

    assert {activity(again)[(pid, GPU0)] for pid in (11, 12, 13)} == {IDLE}  # nothing newer than 2,000 µs
    assert again.activity_devices == frozenset({GPU0})  # NOT_FOUND: sampled, and idle
    assert counters.results(NEW_CALL, "NOT_FOUND") == 1
    assert again.problems == ()


def test_live_samples_keep_coming_across_snapshots(fake_lib: Path, open_nvml: OpenNvml) -> None:
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0),),
        processes=(FakeProcess(0, pid=11),),
        samples=(FakeUtilSample(0, pid=11, sm=25),),
        util_period_us=20_000,
    )
    nvml = open_nvml(config)
    clock = FakeNvmlClock(fake_lib)
    clock.set(1_000_000_000)
    first = nvml.snapshot()
    clock.set(1_000_000_000 + 20_000)  # one sampling period of the fake driver later: a newer sample exists
    second = nvml.snapshot()

    assert activity(first)[(11, GPU0)] == activity(second)[(11, GPU0)] == Activity(sm=0.25)


def test_several_samples_of_one_process_are_averaged(open_nvml: OpenNvml) -> None:
    config = SAMPLED_NODE.sampling(
        FakeUtilSample(0, pid=11, sm=20, at=1_000),
        FakeUtilSample(0, pid=11, sm=60, decoder=10, at=2_000),
    )

    assert activity(open_nvml(config).snapshot())[(11, GPU0)] == Activity(sm=0.40, decoder=0.05)


def test_samples_of_pids_in_no_process_list_are_left_out(open_nvml: OpenNvml) -> None:
    config = SAMPLED_NODE.sampling(
        FakeUtilSample(0, pid=99, sm=80, at=1_000), FakeUtilSample(0, pid=11, sm=10, at=1_000)
    )
    snapshot = open_nvml(config).snapshot()

    assert {pid for pid, _ in activity(snapshot)} == {11, 12, 13, 21}
    assert activity(snapshot)[(11, GPU0)] == Activity(sm=0.10)


def test_a_driver_without_the_versioned_call_uses_the_older_one_from_then_on(
    fake_lib: Path, open_nvml: OpenNvml
) -> None:
    counters = FakeNvmlCounters(fake_lib)
    nvml = open_nvml(SAMPLED_NODE.with_errors(FakeError(NEW_CALL, "FUNCTION_NOT_FOUND")))
    counters.reset()

    first = nvml.snapshot()
    second = nvml.snapshot()

    assert activity(first)[(12, GPU0)] == Activity(sm=0.90, memory_controller=0.50)
    assert activity(second)[(12, GPU0)] == IDLE
    assert counters.calls(NEW_CALL) == 1  # learnt once
    assert counters.results(OLD_CALL, "INSUFFICIENT_SIZE") == 1  # pynvml's probe, then its read
    assert counters.results(OLD_CALL, "SUCCESS") == 1
    assert counters.results(OLD_CALL, "NOT_FOUND") == 1
    assert first.problems == second.problems == ()


def test_a_version_mismatch_of_the_versioned_struct_uses_the_older_call(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(SAMPLED_NODE.with_errors(FakeError(NEW_CALL, 25))).snapshot()

    assert activity(snapshot)[(11, GPU0)] == Activity(sm=0.40, memory_controller=0.10, encoder=0.02, decoder=0.04)
    assert snapshot.problems == ()


@pytest.mark.parametrize(
    "errors",
    [
        (FakeError(NEW_CALL, "NOT_SUPPORTED"),),
        (FakeError(NEW_CALL, "FUNCTION_NOT_FOUND"), FakeError(OLD_CALL, "FUNCTION_NOT_FOUND")),
    ],
    ids=["not-supported", "neither-call"],
)
def test_a_gpu_nvml_cannot_sample_is_unknown_quietly_and_not_asked_again(
    fake_lib: Path, open_nvml: OpenNvml, errors: tuple[FakeError, ...]
) -> None:
    counters = FakeNvmlCounters(fake_lib)
    nvml = open_nvml(SAMPLED_NODE.with_errors(*errors))
    counters.reset()
    first = nvml.snapshot()
    asked = counters.calls(NEW_CALL) + counters.calls(OLD_CALL)
    second = nvml.snapshot()

    for snapshot in (first, second):
        assert snapshot.activity_devices == frozenset()
        assert {activity(snapshot)[(pid, GPU0)] for pid in (11, 12, 13)} == {None}
        assert snapshot.problems == ()
    assert counters.calls(NEW_CALL) + counters.calls(OLD_CALL) == asked  # the second snapshot asked nothing


def test_another_error_is_a_problem_for_that_snapshot_only(open_nvml: OpenNvml) -> None:
    nvml = open_nvml(SAMPLED_NODE.with_errors(FakeError(NEW_CALL, "UNKNOWN", device=0, times=1)))

    failed = nvml.snapshot()
    recovered = nvml.snapshot()

    assert failed.activity_devices == frozenset() and activity(failed)[(11, GPU0)] is None
    assert [(problem.device, problem.reason) for problem in failed.problems] == [(GPU0, "unknown")]
    assert "per-process utilisation" in failed.problems[0].message
    assert activity(recovered)[(12, GPU0)] == Activity(sm=0.90, memory_controller=0.50)  # the cursor did not move


def test_samples_that_appear_between_pynvmls_two_calls_are_asked_again(open_nvml: OpenNvml) -> None:
    # pynvml's probe answers; its read is refused as too small once (a sample appeared in between).
    grown = FakeError(NEW_CALL, "INSUFFICIENT_SIZE", device=0, times=2)
    snapshot = open_nvml(SAMPLED_NODE.with_errors(grown)).snapshot()

    assert activity(snapshot)[(12, GPU0)] == Activity(sm=0.90, memory_controller=0.50)
    assert snapshot.problems == ()


def test_a_sample_count_that_never_settles_is_a_problem(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(SAMPLED_NODE.with_errors(FakeError(NEW_CALL, "INSUFFICIENT_SIZE", device=0))).snapshot()

    assert snapshot.activity_devices == frozenset()
    assert [problem.device for problem in snapshot.problems] == [GPU0]
    assert "kept changing" in snapshot.problems[0].message


def test_a_value_above_100_percent_makes_that_gpus_activity_unknown(open_nvml: OpenNvml) -> None:
    nvml = open_nvml(
        SAMPLED_NODE.sampling(FakeUtilSample(0, pid=11, sm=40, at=1_000), FakeUtilSample(0, pid=12, sm=250))
    )

    garbage = nvml.snapshot()

    assert garbage.activity_devices == frozenset() and activity(garbage)[(11, GPU0)] is None
    assert [(problem.device, problem.reason) for problem in garbage.problems] == [(GPU0, "unknown")]
    assert "above 100%" in garbage.problems[0].message


def test_a_gpu_lost_while_sampling_drops_the_card(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(SAMPLED_NODE.with_errors(FakeError(NEW_CALL, "GPU_IS_LOST", device=0))).snapshot()

    assert GPU0 not in {device.uuid for device in snapshot.devices}
    assert [(problem.device, problem.reason) for problem in snapshot.problems] == [(GPU0, "gpu-lost")]


def test_reopening_starts_from_the_drivers_whole_buffer(fake_lib: Path, open_nvml: OpenNvml) -> None:
    first = open_nvml(SAMPLED_NODE)
    first.snapshot()
    first.close()

    reopened = open_nvml(SAMPLED_NODE).snapshot()

    assert activity(reopened)[(12, GPU0)] == Activity(sm=0.90, memory_controller=0.50)


# ---- activity under MPS: the real driver gives every client's samples to the MPS server's pid -------------------

#: GPU 0 runs an MPS server (pid 30) with three busy clients, as on the H200 (driver 580.159.04); GPU 1 beside it is
#: time-sliced between two busy processes.
MPS_NODE = FakeNvmlConfig(
    gpus=(FakeGpu(0, name="NVIDIA H200"), FakeGpu(1)),
    mps_servers=(FakeMpsServer(0, pid=30, used_memory_bytes=69_206_016),),
    processes=(
        FakeProcess(0, pid=31, used_memory_bytes=4_366_270_464, kind="mps"),
        FakeProcess(0, pid=32, used_memory_bytes=5_440_012_288, kind="mps"),
        FakeProcess(0, pid=33, used_memory_bytes=1_713_373_184, kind="mps"),
        FakeProcess(1, pid=41),
        FakeProcess(1, pid=42),
    ),
    samples=(
        FakeUtilSample(0, pid=31, sm=60, at=1_000),
        FakeUtilSample(0, pid=32, sm=40, at=1_000),
        FakeUtilSample(1, pid=41, sm=62, at=1_000),
        FakeUtilSample(1, pid=42, sm=36, at=1_000),
    ),
)


def test_mps_clients_are_counted_once_with_their_own_memory_and_the_server_with_its_own(open_nvml: OpenNvml) -> None:
    snapshot = open_nvml(MPS_NODE).snapshot()

    on_gpu0 = {(p.pid, p.used_memory_bytes, p.kind) for p in snapshot.processes if p.device_uuid == GPU0}
    assert on_gpu0 == {
        (30, 69_206_016, "compute"),
        (31, 4_366_270_464, "compute+mps"),
        (32, 5_440_012_288, "compute+mps"),
        (33, 1_713_373_184, "compute+mps"),
    }


def test_a_gpu_with_mps_clients_has_unknown_activity_and_a_gpu_without_keeps_its_numbers(
    fake_lib: Path, open_nvml: OpenNvml
) -> None:
    counters = FakeNvmlCounters(fake_lib)
    nvml = open_nvml(MPS_NODE)
    counters.reset()
    snapshot = nvml.snapshot()

    found = activity(snapshot)
    assert {found[(pid, GPU0)] for pid in (30, 31, 32, 33)} == {None}  # not 0, and not the server's 100 either
    assert dict(snapshot.activity_unknown) == {GPU0: ActivityUnknown.MPS}
    assert found[(41, GPU1)] == Activity(sm=0.62) and found[(42, GPU1)] == Activity(sm=0.36)
    assert snapshot.activity_devices == frozenset({GPU1})
    assert snapshot.problems == ()
    assert counters.results(NEW_CALL, "SUCCESS") == 2  # GPU 0 asked too: its cursor moves past what no one can use


def test_the_mps_servers_samples_are_not_its_own_activity(open_nvml: OpenNvml) -> None:
    """Without a client in the MPS list the server's samples are its own (idle, or a client gone since): with one,
    they are every client's, and not given to the server's process."""
    serving = open_nvml(MPS_NODE.sampling(FakeUtilSample(0, pid=31, sm=97, at=1_000)))
    assert activity(serving.snapshot())[(30, GPU0)] is None
    serving.close()  # the fake reads its next configuration at the next first init

    alone = FakeNvmlConfig(
        gpus=(FakeGpu(0),),
        mps_servers=(FakeMpsServer(0, pid=30),),
        samples=(FakeUtilSample(0, pid=30, sm=3, at=1_000),),
    )
    snapshot = open_nvml(alone).snapshot()
    assert activity(snapshot) == {(30, GPU0): Activity(sm=0.03)} and snapshot.activity_unknown == ()


def test_an_mps_list_that_cannot_be_read_makes_activity_unknown(open_nvml: OpenNvml) -> None:
    failing = FakeError("nvmlDeviceGetMPSComputeRunningProcesses_v3", "UNKNOWN", device=1)
    snapshot = open_nvml(MPS_NODE.with_errors(failing)).snapshot()

    assert dict(snapshot.activity_unknown) == {GPU0: ActivityUnknown.MPS, GPU1: ActivityUnknown.ERROR}
    assert activity(snapshot)[(41, GPU1)] is None
    assert [(problem.device, problem.reason) for problem in snapshot.problems] == [(GPU1, "unknown")]


@pytest.mark.parametrize(
    ("errors", "why"),
    [
        ((FakeError(NEW_CALL, "NOT_SUPPORTED"),), ActivityUnknown.NOT_SUPPORTED),
        ((FakeError(NEW_CALL, "UNKNOWN"),), ActivityUnknown.ERROR),
    ],
    ids=["not-supported", "error"],
)
def test_every_device_without_activity_says_why(
    open_nvml: OpenNvml, errors: tuple[FakeError, ...], why: ActivityUnknown
) -> None:
    snapshot = open_nvml(SAMPLED_NODE.with_errors(*errors)).snapshot()

    assert dict(snapshot.activity_unknown) == {GPU0: why, GPU1: ActivityUnknown.MIG, MIG10: ActivityUnknown.MIG}
    assert snapshot.activity_devices == frozenset()
