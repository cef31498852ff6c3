"""The fake libnvidia-ml.so.1 itself: NVML's calling conventions at the C boundary, and its configuration.

The adapter tests trust the fake; these tests are why. They call the C symbols through ctypes with the
argument shapes nvml.h documents (not only the ones pynvml happens to use), and pynvml's own wrappers.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpu_fence.auditor.nvml import Nvml
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
    fake_gpu_uuid,
    fake_mig_uuid,
    mig_node,
)

pytest_plugins = ["tests.fakes.nvml.fixtures"]  # the fake_lib fixture

SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, INSUFFICIENT_SIZE = 0, 1, 2, 3, 6, 7
DRIVER_NOT_LOADED, GPU_IS_LOST, VERSION_MISMATCH, UNKNOWN = 9, 15, 25, 999


class ProcessInfo(ctypes.Structure):
    """nvml.h nvmlProcessInfo_v2_t, written out here rather than taken from pynvml."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


NODE = FakeNvmlConfig(
    gpus=(FakeGpu(0), FakeGpu(1, mig=True)),
    migs=(FakeMig(1, 0, gpu_instance_id=5, compute_instance_id=1, slices=2, memory_total_bytes=20 * GIB),),
    processes=(
        FakeProcess(0, pid=11, used_memory_bytes=3 * GIB),
        FakeProcess(0, pid=12, used_memory_bytes=None),
        FakeProcess(0, pid=13, used_memory_bytes=GIB, kind="graphics"),
        FakeProcess(fake_mig_uuid(1, 0), pid=21, used_memory_bytes=2 * GIB),
    ),
)


@pytest.fixture
def nvml_c(fake_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    """The fake loaded as a plain C library and initialised with NODE; shut down afterwards."""
    monkeypatch.setenv(CONFIG_ENV, str(NODE.write(tmp_path / "nvml.conf")))
    lib = ctypes.CDLL(str(fake_lib))
    assert lib.nvmlInit_v2() == SUCCESS
    yield lib
    assert lib.nvmlShutdown() == SUCCESS


@pytest.fixture
def init_with(fake_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """``init_with(text)``: write a raw config, init the C library, return the NVML code (shut down afterwards)."""
    lib = ctypes.CDLL(str(fake_lib))
    inits = []

    def init(text: str) -> int:
        path = tmp_path / f"raw-{len(inits)}.conf"
        path.write_text(text)
        monkeypatch.setenv(CONFIG_ENV, str(path))
        code = lib.nvmlInit_v2()
        if code == SUCCESS:
            inits.append(path)
        return code

    yield init
    for _ in inits:
        lib.nvmlShutdown()


def handle(lib: ctypes.CDLL, index: int) -> ctypes.c_void_p:
    device = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(device)) == SUCCESS
    return device


def mig_handle(lib: ctypes.CDLL, gpu: int, slot: int) -> ctypes.c_void_p:
    device = ctypes.c_void_p()
    assert lib.nvmlDeviceGetMigDeviceHandleByIndex(handle(lib, gpu), slot, ctypes.byref(device)) == SUCCESS
    return device


# ---- the process-list size protocol (nvml.h) -------------------------------------------------------------


def test_probe_with_null_buffer_answers_insufficient_size_and_the_count(nvml_c: ctypes.CDLL) -> None:
    count = ctypes.c_uint(0)
    assert nvml_c.nvmlDeviceGetComputeRunningProcesses_v3(handle(nvml_c, 0), ctypes.byref(count), None) == 7
    assert count.value == 2


def test_too_small_buffer_answers_insufficient_size_without_writing(nvml_c: ctypes.CDLL) -> None:
    buffer = (ProcessInfo * 1)()
    buffer[0].pid = 4242
    count = ctypes.c_uint(1)
    code = nvml_c.nvmlDeviceGetComputeRunningProcesses_v3(handle(nvml_c, 0), ctypes.byref(count), buffer)

    assert (code, count.value, buffer[0].pid) == (INSUFFICIENT_SIZE, 2, 4242)


def test_big_enough_buffer_gets_the_processes_and_the_real_count(nvml_c: ctypes.CDLL) -> None:
    buffer = (ProcessInfo * 8)()
    count = ctypes.c_uint(8)
    code = nvml_c.nvmlDeviceGetComputeRunningProcesses_v3(handle(nvml_c, 0), ctypes.byref(count), buffer)

    assert (code, count.value) == (SUCCESS, 2)
    rows = [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in buffer[:2]]
    assert rows == [(11, 3 * GIB, 0xFFFFFFFF, 0xFFFFFFFF), (12, 0xFFFFFFFFFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)]


def test_no_processes_answers_success_and_zero_on_the_probe(nvml_c: ctypes.CDLL) -> None:
    count = ctypes.c_uint(0)
    code = nvml_c.nvmlDeviceGetMPSComputeRunningProcesses_v3(handle(nvml_c, 0), ctypes.byref(count), None)

    assert (code, count.value) == (SUCCESS, 0)


def test_null_count_is_an_invalid_argument(nvml_c: ctypes.CDLL) -> None:
    assert nvml_c.nvmlDeviceGetComputeRunningProcesses_v3(handle(nvml_c, 0), None, None) == INVALID_ARGUMENT


def test_mig_processes_carry_instance_ids_on_the_parent_and_on_the_mig_handle(nvml_c: ctypes.CDLL) -> None:
    for device in (handle(nvml_c, 1), mig_handle(nvml_c, 1, 0)):
        buffer = (ProcessInfo * 4)()
        count = ctypes.c_uint(4)
        assert nvml_c.nvmlDeviceGetComputeRunningProcesses_v2(device, ctypes.byref(count), buffer) == SUCCESS
        assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in buffer[: count.value]] == [(21, 5, 1)]


# ---- per-process utilisation: lastSeenTimeStamp and the size protocol (nvml.h) ------------------------------


class UtilizationSample(ctypes.Structure):
    """nvml.h nvmlProcessUtilizationSample_t, written out here rather than taken from pynvml."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class UtilizationInfo(ctypes.Structure):
    """nvml.h nvmlProcessUtilizationInfo_v1_t."""

    _fields_ = [
        ("timeStamp", ctypes.c_ulonglong),
        *((name, ctypes.c_uint) for name in ("pid", "smUtil", "memUtil", "encUtil", "decUtil", "jpgUtil", "ofaUtil")),
    ]


class UtilizationInfos(ctypes.Structure):
    """nvml.h nvmlProcessesUtilizationInfo_v1_t; its version is NVML_STRUCT_VERSION(ProcessesUtilizationInfo, 1)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("processSamplesCount", ctypes.c_uint),
        ("lastSeenTimeStamp", ctypes.c_ulonglong),
        ("procUtilArray", ctypes.POINTER(UtilizationInfo)),
    ]


UTILIZATION_INFOS_V1 = ctypes.sizeof(UtilizationInfos) | 1 << 24
SAMPLED = FakeNvmlConfig(
    gpus=(FakeGpu(0), FakeGpu(1, mig=True)),
    migs=(FakeMig(1, 0, gpu_instance_id=5),),
    samples=(
        FakeUtilSample(0, pid=11, sm=40, memory=10, encoder=1, decoder=2, jpeg=3, ofa=4, at=1_000),
        FakeUtilSample(0, pid=12, sm=90, at=2_000),
        FakeUtilSample(0, pid=11, sm=60, at=3_000),
        FakeUtilSample(1, pid=21, sm=50, at=1_000),
        FakeUtilSample(fake_mig_uuid(1, 0), pid=21, sm=50, at=1_000),
    ),
)


@pytest.fixture
def sampled_c(fake_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    monkeypatch.setenv(CONFIG_ENV, str(SAMPLED.write(tmp_path / "nvml.conf")))
    lib = ctypes.CDLL(str(fake_lib))
    assert lib.nvmlInit_v2() == SUCCESS
    yield lib
    assert lib.nvmlShutdown() == SUCCESS


def process_utilization(lib: ctypes.CDLL, device: ctypes.c_void_p, room: int | None, last_seen: int) -> tuple:
    """(code, count, samples written) of one nvmlDeviceGetProcessUtilization call with a buffer of ``room``."""
    buffer = (UtilizationSample * room)() if room is not None else None
    count = ctypes.c_uint(room or 0)
    code = lib.nvmlDeviceGetProcessUtilization(device, buffer, ctypes.byref(count), ctypes.c_ulonglong(last_seen))
    written = [(s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil) for s in (buffer or [])]
    return code, count.value, written


def test_process_utilization_probe_answers_insufficient_size_with_the_count(sampled_c: ctypes.CDLL) -> None:
    assert process_utilization(sampled_c, handle(sampled_c, 0), None, 0)[:2] == (INSUFFICIENT_SIZE, 3)


def test_process_utilization_too_small_a_buffer_writes_nothing(sampled_c: ctypes.CDLL) -> None:
    code, count, written = process_utilization(sampled_c, handle(sampled_c, 0), 2, 0)

    assert (code, count) == (INSUFFICIENT_SIZE, 3)
    assert [row[0] for row in written] == [0, 0]


def test_process_utilization_returns_only_samples_newer_than_last_seen(sampled_c: ctypes.CDLL) -> None:
    code, count, written = process_utilization(sampled_c, handle(sampled_c, 0), 4, 1_000)

    assert (code, count) == (SUCCESS, 2)
    assert written[:2] == [(12, 2_000, 90, 0, 0, 0), (11, 3_000, 60, 0, 0, 0)]
    assert process_utilization(sampled_c, handle(sampled_c, 0), 4, 0)[2][0] == (11, 1_000, 40, 10, 1, 2)


def test_process_utilization_answers_not_found_when_no_sample_is_newer(sampled_c: ctypes.CDLL) -> None:
    assert process_utilization(sampled_c, handle(sampled_c, 0), None, 3_000)[:2] == (NOT_FOUND, 0)
    assert process_utilization(sampled_c, handle(sampled_c, 0), 4, 3_000)[:2] == (NOT_FOUND, 0)


def test_process_utilization_is_not_supported_on_a_mig_enabled_gpu(sampled_c: ctypes.CDLL) -> None:
    """nvml.h: "On MIG-enabled GPUs, querying process utilization is not currently supported"."""
    for device in (handle(sampled_c, 1), mig_handle(sampled_c, 1, 0)):
        assert process_utilization(sampled_c, device, 4, 0)[0] == NOT_SUPPORTED
        infos = UtilizationInfos(version=UTILIZATION_INFOS_V1)
        assert sampled_c.nvmlDeviceGetProcessesUtilizationInfo(device, ctypes.byref(infos)) == NOT_SUPPORTED


def test_processes_utilization_info_size_protocol_and_last_seen(sampled_c: ctypes.CDLL) -> None:
    device = handle(sampled_c, 0)
    infos = UtilizationInfos(version=UTILIZATION_INFOS_V1, processSamplesCount=0, lastSeenTimeStamp=0)
    assert sampled_c.nvmlDeviceGetProcessesUtilizationInfo(device, ctypes.byref(infos)) == INSUFFICIENT_SIZE
    assert infos.processSamplesCount == 3

    array = (UtilizationInfo * 2)()
    infos.procUtilArray, infos.processSamplesCount = array, 2
    assert sampled_c.nvmlDeviceGetProcessesUtilizationInfo(device, ctypes.byref(infos)) == INSUFFICIENT_SIZE
    assert (infos.processSamplesCount, array[0].pid) == (3, 0)

    array = (UtilizationInfo * 3)()
    infos.procUtilArray, infos.processSamplesCount = array, 3
    assert sampled_c.nvmlDeviceGetProcessesUtilizationInfo(device, ctypes.byref(infos)) == SUCCESS
    first = array[0]
    assert (first.timeStamp, first.pid, first.smUtil, first.memUtil, first.encUtil, first.decUtil) == (
        1_000,
        11,
        40,
        10,
        1,
        2,
    )
    assert (first.jpgUtil, first.ofaUtil) == (3, 4)
    assert (infos.processSamplesCount, infos.lastSeenTimeStamp) == (3, 3_000)  # NVML advances the cursor

    assert sampled_c.nvmlDeviceGetProcessesUtilizationInfo(device, ctypes.byref(infos)) == NOT_FOUND


def test_processes_utilization_info_checks_its_version(sampled_c: ctypes.CDLL) -> None:
    infos = UtilizationInfos(version=ctypes.sizeof(UtilizationInfos) | 2 << 24)

    assert sampled_c.nvmlDeviceGetProcessesUtilizationInfo(handle(sampled_c, 0), ctypes.byref(infos)) == (
        VERSION_MISMATCH
    )
    assert sampled_c.nvmlDeviceGetProcessesUtilizationInfo(handle(sampled_c, 0), None) == INVALID_ARGUMENT


def test_live_samples_are_stamped_at_the_latest_period_before_now(fake_lib: Path, init_with) -> None:
    assert init_with("util_period 250000\ngpu 0 GPU-a 0 1 A\nutil 0 7 30 0 0 0\n") == SUCCESS
    lib = ctypes.CDLL(str(fake_lib))
    before = int(time.time() * 1e6)
    code, count, written = process_utilization(lib, handle(lib, 0), 1, 0)
    after = int(time.time() * 1e6)

    assert (code, count) == (SUCCESS, 1)
    stamp = written[0][1]
    assert stamp % 250_000 == 0 and before - 250_000 < stamp <= after
    assert process_utilization(lib, handle(lib, 0), 1, stamp)[0] in (NOT_FOUND, SUCCESS)  # SUCCESS: a new period


def test_a_test_sets_the_clock_live_samples_are_stamped_with_and_a_new_configuration_resets_it(
    fake_lib: Path, init_with
) -> None:
    lib = ctypes.CDLL(str(fake_lib))
    clock = FakeNvmlClock(fake_lib)
    assert init_with("util_period 250000\ngpu 0 GPU-a 0 1 A\nutil 0 7 30 0 0 0\n") == SUCCESS
    clock.set(10_100_000)
    assert process_utilization(lib, handle(lib, 0), 1, 0)[2][0][1] == 10_000_000
    assert process_utilization(lib, handle(lib, 0), 1, 10_000_000)[0] == NOT_FOUND  # time stood still
    clock.set(10_250_000)
    assert process_utilization(lib, handle(lib, 0), 1, 10_000_000)[2][0][1] == 10_250_000

    assert lib.nvmlShutdown() == SUCCESS and lib.nvmlInit_v2() == SUCCESS  # the configuration read again
    assert process_utilization(lib, handle(lib, 0), 1, 0)[2][0][1] > 10_250_000  # the real clock again


@pytest.mark.usefixtures("bound_sampled")
def test_pynvml_reads_both_calls_and_raises_not_found_when_idle() -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)

    old = pynvml.nvmlDeviceGetProcessUtilization(gpu, 1_000)
    new = pynvml.nvmlDeviceGetProcessesUtilizationInfo(gpu, 1_000)
    assert [(s.pid, s.timeStamp, s.smUtil) for s in old] == [(12, 2_000, 90), (11, 3_000, 60)]
    assert [(s.pid, s.timeStamp, s.smUtil) for s in new] == [(12, 2_000, 90), (11, 3_000, 60)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(gpu, 3_000)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessesUtilizationInfo(gpu, 3_000)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetProcessesUtilizationInfo(pynvml.nvmlDeviceGetHandleByIndex(1), 0)


@pytest.fixture
def bound_sampled(fake_lib: Path, sampled_c: ctypes.CDLL) -> Iterator[None]:
    with Nvml(str(fake_lib)):
        yield


# ---- MPS: what the real driver showed (H200, driver 580.159.04, docs/nvml.md "MPS on a real driver") ----------

#: The H200 run's three clients with the bytes NVML gave each, and the MPS server's own 69,206,016 bytes.
CLIENT_BYTES = {31: 4_366_270_464, 32: 5_440_012_288, 33: 1_713_373_184}
SERVER_PID, SERVER_BYTES = 30, 69_206_016
MPS_NODE = FakeNvmlConfig(
    gpus=(FakeGpu(0, name="NVIDIA H200", memory_total_bytes=141 * GIB), FakeGpu(1)),
    mps_servers=(FakeMpsServer(0, SERVER_PID, SERVER_BYTES),),
    processes=(
        *(FakeProcess(0, pid=pid, used_memory_bytes=size, kind="mps") for pid, size in CLIENT_BYTES.items()),
        FakeProcess(1, pid=41, used_memory_bytes=GIB, kind="mps"),  # an MPS list without a server: that list alone
    ),
    samples=(
        FakeUtilSample(0, pid=31, sm=60, memory=20, at=1_000),
        FakeUtilSample(0, pid=32, sm=35, memory=30, at=1_000),
        FakeUtilSample(0, pid=31, sm=70, memory=90, at=2_000),
        FakeUtilSample(0, pid=32, sm=50, memory=40, at=2_000),
        FakeUtilSample(0, pid=99, sm=10, at=2_000),  # a pid that is no client of the server keeps its own samples
    ),
)


@pytest.fixture
def bound_mps(fake_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """pynvml bound to the fake, initialised with MPS_NODE."""
    monkeypatch.setenv(CONFIG_ENV, str(MPS_NODE.write(tmp_path / "nvml.conf")))
    with Nvml(str(fake_lib)):
        yield


def listed(processes: list) -> dict[int, int]:
    return {int(process.pid): int(process.usedGpuMemory) for process in processes}


@pytest.mark.usefixtures("bound_mps")
def test_mps_clients_are_in_the_compute_and_the_mps_list_with_their_own_memory() -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)

    assert listed(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(gpu)) == CLIENT_BYTES
    assert listed(pynvml.nvmlDeviceGetComputeRunningProcesses(gpu)) == CLIENT_BYTES | {SERVER_PID: SERVER_BYTES}


@pytest.mark.usefixtures("bound_mps")
def test_the_mps_server_is_in_the_compute_list_alone_and_the_card_counts_everyone_once() -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)

    assert SERVER_PID not in listed(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(gpu))
    assert pynvml.nvmlDeviceGetMemoryInfo(gpu).used == sum(CLIENT_BYTES.values()) + SERVER_BYTES


@pytest.mark.usefixtures("bound_mps")
def test_without_a_server_an_mps_process_is_in_the_mps_list_alone() -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(1)

    assert listed(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(gpu)) == {41: GIB}
    assert listed(pynvml.nvmlDeviceGetComputeRunningProcesses(gpu)) == {}


@pytest.mark.usefixtures("bound_mps")
def test_under_mps_every_clients_sample_is_the_servers() -> None:
    """The real driver returned samples for the server's pid only (smUtil 97-100) while its clients were busy: one
    sample per instant, the clients' values added."""
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)

    for samples in (
        pynvml.nvmlDeviceGetProcessUtilization(gpu, 0),
        pynvml.nvmlDeviceGetProcessesUtilizationInfo(gpu, 0),
    ):
        rows = sorted((s.timeStamp, s.pid, s.smUtil, s.memUtil) for s in samples)
        assert rows == [(1_000, SERVER_PID, 95, 50), (2_000, SERVER_PID, 100, 100), (2_000, 99, 10, 0)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(gpu, 2_000)


# ---- handles, MIG and versioned structs ---------------------------------------------------------------------


def test_calls_before_init_answer_uninitialized(fake_lib: Path) -> None:
    lib = ctypes.CDLL(str(fake_lib))
    count = ctypes.c_uint()

    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == UNINITIALIZED
    assert lib.nvmlShutdown() == UNINITIALIZED


def test_handles_not_handed_out_are_invalid_arguments(nvml_c: ctypes.CDLL) -> None:
    bogus = ctypes.create_string_buffer(256)
    minor = ctypes.c_uint()
    device = ctypes.c_void_p()

    assert nvml_c.nvmlDeviceGetMinorNumber(bogus, ctypes.byref(minor)) == INVALID_ARGUMENT
    assert nvml_c.nvmlDeviceGetHandleByIndex_v2(2, ctypes.byref(device)) == INVALID_ARGUMENT


@pytest.fixture
def bound(fake_lib: Path, nvml_c: ctypes.CDLL) -> Iterator[None]:
    """pynvml bound to the fake (through the adapter, which owns that global) and initialised with NODE."""
    with Nvml(str(fake_lib)):
        yield


@pytest.mark.usefixtures("bound")
def test_mig_walk_through_pynvml() -> None:
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)

    assert pynvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)  # an empty slot
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(parent).value == 0
    assert pynvml.nvmlDeviceGetUUID(mig) == fake_mig_uuid(1, 0)
    assert (pynvml.nvmlDeviceGetGpuInstanceId(mig), pynvml.nvmlDeviceGetComputeInstanceId(mig)) == (5, 1)
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == fake_gpu_uuid(1)
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByUUID(fake_mig_uuid(1, 0))) == fake_mig_uuid(1, 0)
    attributes = pynvml.nvmlDeviceGetAttributes(mig)
    assert (attributes.gpuInstanceSliceCount, attributes.memorySizeMB) == (2, 20 * 1024)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAttributes(parent)  # nvml.h: MIG device handles only
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(parent)
    whole = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
    assert (whole.sliceCount, whole.instanceCount) == (7, 1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE)


@pytest.mark.usefixtures("bound")
def test_memory_info_v1_and_v2_layouts() -> None:
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)

    v1 = pynvml.nvmlDeviceGetMemoryInfo(gpu)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(gpu, version=pynvml.nvmlMemory_v2)
    assert (v1.total, v1.used, v1.free) == (80 * GIB, 3 * GIB, 77 * GIB)  # used = its compute processes
    assert (v2.total, v2.reserved, v2.used, v2.free) == (80 * GIB, 0, 3 * GIB, 77 * GIB)


def test_versioned_structs_reject_a_wrong_version(nvml_c: ctypes.CDLL) -> None:
    memory = pynvml.c_nvmlMemory_v2_t()
    memory.version = 1
    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 0x01000098

    assert nvml_c.nvmlDeviceGetMemoryInfo_v2(handle(nvml_c, 0), ctypes.byref(memory)) == VERSION_MISMATCH
    assert nvml_c.nvmlDeviceGetGpuInstanceProfileInfoV(handle(nvml_c, 1), 4, ctypes.byref(info)) == VERSION_MISMATCH


def test_strings_respect_the_buffer_length(nvml_c: ctypes.CDLL) -> None:
    short = ctypes.create_string_buffer(8)
    assert nvml_c.nvmlDeviceGetUUID(handle(nvml_c, 0), short, 8) == INSUFFICIENT_SIZE
    long = ctypes.create_string_buffer(96)
    assert nvml_c.nvmlDeviceGetUUID(handle(nvml_c, 0), long, 96) == SUCCESS
    assert long.value.decode() == fake_gpu_uuid(0)


def test_error_string_for_every_code_pynvml_may_ask(nvml_c: ctypes.CDLL) -> None:
    nvml_c.nvmlErrorString.restype = ctypes.c_char_p
    assert nvml_c.nvmlErrorString(GPU_IS_LOST) == b"GPU is lost"
    assert nvml_c.nvmlErrorString(12345) == b"Unknown Error"


# ---- configuration: re-reading, injected errors, the log, bad files -------------------------------------------


def test_config_is_read_at_first_init_only(fake_lib: Path, init_with) -> None:
    lib = ctypes.CDLL(str(fake_lib))
    count = ctypes.c_uint()
    assert init_with(FakeNvmlConfig(gpus=(FakeGpu(0),)).render()) == SUCCESS
    assert init_with(FakeNvmlConfig(gpus=(FakeGpu(0), FakeGpu(1))).render()) == SUCCESS  # refcount 2: not re-read

    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == SUCCESS
    assert count.value == 1


def test_a_reload_forgets_the_previous_error_rules(fake_lib: Path, init_with) -> None:
    lib = ctypes.CDLL(str(fake_lib))
    minor = ctypes.c_uint()
    first = FakeNvmlConfig(gpus=(FakeGpu(0),), errors=(FakeError("nvmlDeviceGetMinorNumber", "UNKNOWN", device=0),))
    assert init_with(first.render()) == SUCCESS
    assert lib.nvmlDeviceGetMinorNumber(handle(lib, 0), ctypes.byref(minor)) == UNKNOWN
    assert lib.nvmlShutdown() == SUCCESS

    second = FakeNvmlConfig(gpus=(FakeGpu(0),), errors=(FakeError("nvmlDeviceGetMinorNumber", "NOT_SUPPORTED"),))
    assert init_with(second.render()) == SUCCESS
    assert lib.nvmlDeviceGetMinorNumber(handle(lib, 0), ctypes.byref(minor)) == NOT_SUPPORTED


def test_error_rules_select_by_uuid_or_index_and_count_down(fake_lib: Path, init_with) -> None:
    lib = ctypes.CDLL(str(fake_lib))
    config = FakeNvmlConfig(
        gpus=(FakeGpu(0), FakeGpu(1), FakeGpu(2)),
        errors=(
            FakeError("nvmlDeviceGetMinorNumber", "GPU_IS_LOST", device=fake_gpu_uuid(1)),
            FakeError("nvmlDeviceGetMinorNumber", "NOT_FOUND", device=2, times=1),
        ),
    )
    assert init_with(config.render()) == SUCCESS
    minor = ctypes.c_uint()

    def minor_of(index: int) -> int:
        return lib.nvmlDeviceGetMinorNumber(handle(lib, index), ctypes.byref(minor))

    assert [minor_of(0), minor_of(1), minor_of(2), minor_of(2), minor_of(1)] == [
        SUCCESS, GPU_IS_LOST, NOT_FOUND, SUCCESS, GPU_IS_LOST,
    ]  # fmt: skip


def test_log_records_each_call_with_its_result(fake_lib: Path, tmp_path: Path, init_with) -> None:
    log = tmp_path / "calls.log"
    lib = ctypes.CDLL(str(fake_lib))
    assert init_with(FakeNvmlConfig(gpus=(FakeGpu(0),), log_path=str(log)).render()) == SUCCESS
    count = ctypes.c_uint()
    lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
    lib.nvmlDeviceGetCount_v2(None)

    assert log.read_text().splitlines() == ["nvmlInit_v2 0", "nvmlDeviceGetCount_v2 0", "nvmlDeviceGetCount_v2 2"]


def test_counters_count_calls_and_results(fake_lib: Path, init_with) -> None:
    counters = FakeNvmlCounters(fake_lib)
    counters.reset()
    lib = ctypes.CDLL(str(fake_lib))
    assert init_with(FakeNvmlConfig(gpus=(FakeGpu(0),)).render()) == SUCCESS
    lib.nvmlDeviceGetCount_v2(None)

    assert counters.calls("nvmlDeviceGetCount_v2") == 1
    assert counters.results("nvmlDeviceGetCount_v2", "INVALID_ARGUMENT") == 1
    assert counters.calls("nvmlNoSuchFunction") == 0


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("gpu zero GPU-x 0 1 name\n", "expected: gpu <index"),
        ("gpu 0 GPU-x 0 1 colour=red Name\n", "unknown gpu option colour=red"),
        ("gpu 0 GPU-a 0 1 A\ngpu 0 GPU-b 1 1 B\n", "GPU index 0 defined twice"),
        ("gpu 1 GPU-a 0 1 A\n", "0..n-1 without gaps; 0 is missing"),
        ("mig 0 0 MIG-a 1 0 1 1\n", "defined by no earlier gpu line"),
        ("gpu 0 GPU-a 0 1 A\nproc 3 compute 1 1\n", "expected: proc"),
        ("gpu 0 GPU-a 0 1 A\nproc 0 cuda 1 1\n", "expected: proc"),
        ("gpu 0 GPU-a 0 1 A\nproc 0 compute 1 lots\n", "bytes or na, not lots"),
        ("error nvmlDeviceGetFoo 3\n", "known NVML function"),
        ("gpu 0 GPU-a 0 1 A\nutil 0 7 30 0 0\n", "expected: util"),
        ("gpu 0 GPU-a 0 1 A\nutil 4 7 30 0 0 0\n", "expected: util"),
        ("gpu 0 GPU-a 0 1 A\nutil 0 7 30 0 0 0 at=0\n", "unknown util option at=0"),
        ("util_period 0\n", "util_period needs microseconds"),
        ("gpu 0 GPU-a 0 1 A\nmps_server 0 7\n", "expected: mps_server"),
        ("gpu 0 GPU-a 0 1 A\nmps_server 0 7 1 8\n", "expected: mps_server"),
        ("gpu 0 GPU-a 0 1 A\nmps_server 0 7 1\nmps_server GPU-a 8 1\n", "a second MPS server on GPU-a"),
        ("frobnicate\n", "unknown keyword frobnicate"),
    ],
)
def test_bad_config_fails_init_and_names_the_line(init_with, capfd: pytest.CaptureFixture, text, complaint) -> None:
    assert init_with(text) == UNKNOWN
    err = capfd.readouterr().err
    assert err.startswith("fake NVML: ") and ".conf:" in err
    assert complaint in err


def test_missing_config_reports_the_driver_as_not_loaded(fake_lib: Path, monkeypatch, capfd) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert ctypes.CDLL(str(fake_lib)).nvmlInit_v2() == DRIVER_NOT_LOADED
    assert "FAKE_NVML_CONFIG is not set" in capfd.readouterr().err


def test_comments_and_blank_lines_are_ignored(fake_lib: Path, init_with) -> None:
    assert init_with("# a node\n\n   \ngpu 0 GPU-a 0 1 mig=0 Card A\n# end\n") == SUCCESS
    name = ctypes.create_string_buffer(96)
    lib = ctypes.CDLL(str(fake_lib))
    assert lib.nvmlDeviceGetName(handle(lib, 0), name, 96) == SUCCESS
    assert name.value == b"Card A"


# ---- the Python writer ------------------------------------------------------------------------------------


def test_writer_renders_the_documented_format() -> None:
    config = FakeNvmlConfig(
        gpus=(
            FakeGpu(0, uuid="GPU-a", minor=4, mig=True, max_slices=4, name="NVIDIA A30", memory_total_bytes=24 * GIB),
        ),
        migs=(FakeMig(0, 1, gpu_instance_id=2, slices=2, memory_total_bytes=12 * GIB, uuid="MIG-b"),),
        processes=(FakeProcess("MIG-b", pid=9, used_memory_bytes=None, kind="mps", gpu_instance_id=2),),
        errors=(FakeError("nvmlDeviceGetUUID", "GPU_IS_LOST", device="GPU-a", times=2),),
        samples=(FakeUtilSample("GPU-a", pid=9, sm=12, memory=3, ofa=1, at=5), FakeUtilSample(0, pid=8)),
        util_period_us=50_000,
        mps_servers=(FakeMpsServer("MIG-b", pid=7, used_memory_bytes=None),),
    )

    assert config.render().splitlines() == [
        "driver 550.163.01",
        "max_slices 7",
        "util_period 50000",
        "gpu 0 GPU-a 4 25769803776 mig=1 max_slices=4 NVIDIA A30",
        "mig 0 1 MIG-b 2 0 2 12884901888 NVIDIA A30 MIG 2g.12gb",
        "mps_server MIG-b 7 na",
        "proc MIG-b mps 9 na gi=2",
        "util GPU-a 9 12 3 0 0 ofa=1 at=5",
        "util 0 8 0 0 0 0",
        "error nvmlDeviceGetUUID 15 device=GPU-a times=2",
    ]


@pytest.mark.parametrize(
    "config",
    [
        FakeNvmlConfig(gpus=(FakeGpu(0, uuid="GPU with spaces"),)),
        FakeNvmlConfig(gpus=(FakeGpu(0, name="two\nlines"),)),
        FakeNvmlConfig(processes=(FakeProcess(0, pid=1, kind="cuda"),)),
        FakeNvmlConfig(samples=(FakeUtilSample(0, pid=1, sm=-1),)),
        FakeNvmlConfig(samples=(FakeUtilSample(0, pid=1, at=0),)),
    ],
)
def test_writer_refuses_what_the_format_cannot_hold(config: FakeNvmlConfig) -> None:
    with pytest.raises(ValueError, match="must be"):
        config.render()


def test_dense_node_helper_shape() -> None:
    config = mig_node(8, 7, 36)

    assert (len(config.gpus), len(config.migs), len(config.processes)) == (8, 56, 2016)
    assert len({process.pid for process in config.processes}) == 2016
