"""The fake libnvidia-ml.so.1 itself: NVML's calling conventions at the C boundary, and its configuration.

The adapter tests trust the fake; these tests are why. They call the C symbols through ctypes with the
argument shapes nvml.h documents (not only the ones pynvml happens to use), and pynvml's own wrappers.
"""

from __future__ import annotations

import ctypes
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
    FakeNvmlConfig,
    FakeNvmlCounters,
    FakeProcess,
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
    )

    assert config.render().splitlines() == [
        "driver 550.163.01",
        "max_slices 7",
        "gpu 0 GPU-a 4 25769803776 mig=1 max_slices=4 NVIDIA A30",
        "mig 0 1 MIG-b 2 0 2 12884901888 NVIDIA A30 MIG 2g.12gb",
        "proc MIG-b mps 9 na gi=2",
        "error nvmlDeviceGetUUID 15 device=GPU-a times=2",
    ]


@pytest.mark.parametrize(
    "config",
    [
        FakeNvmlConfig(gpus=(FakeGpu(0, uuid="GPU with spaces"),)),
        FakeNvmlConfig(gpus=(FakeGpu(0, name="two\nlines"),)),
        FakeNvmlConfig(processes=(FakeProcess(0, pid=1, kind="cuda"),)),
    ],
)
def test_writer_refuses_what_the_format_cannot_hold(config: FakeNvmlConfig) -> None:
    with pytest.raises(ValueError, match="must be"):
        config.render()


def test_dense_node_helper_shape() -> None:
    config = mig_node(8, 7, 36)

    assert (len(config.gpus), len(config.migs), len(config.processes)) == (8, 56, 2016)
    assert len({process.pid for process in config.processes}) == 2016
