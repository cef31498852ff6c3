"""scripts/gpu-smoke.py on a machine without a GPU: the whole flow against the fake NVML (``--dry-run-fake-nvml``),
the failing and cannot-run paths, signals and the time limit, and the pure helpers the checks are built from.

The dry run is the real flow with two stand-ins: the C fake ``libnvidia-ml.so.1`` (loaded by the real pynvml) and a
sleeping child in place of the CUDA process. Everything else is real: the fake kubelet's gRPC server on a unix
socket, ``gpu-fence-auditor once`` as a subprocess, the host's ``/proc``. A fake ``nvidia-smi`` (a shell script)
answers from the same fake configuration, as the real one answers from the same driver.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fakes.nvml import CONFIG_ENV, FakeGpu, FakeNvmlConfig, build_fake_nvml, fake_gpu_uuid
from tests.fakes.polling import wait_for
from tests.fakes.processes import run_captured
from tests.fakes.wheel import build_wheel

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-smoke.py"
MIB = 1 << 20


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


smoke = load_script()

FAKE_NVIDIA_SMI = r"""#!/bin/sh
# A stand-in for nvidia-smi that answers from the fake NVML's configuration ($FAKE_NVML_CONFIG).
case "$1" in
  -L) mode=list ;;
  --query-gpu=*) mode=gpus ;;
  --query-compute-apps=*) mode=apps ;;
  *) echo "fake nvidia-smi: $* is not supported" >&2; exit 2 ;;
esac
exec awk -v mode="$mode" -v driver_override="$FAKE_SMI_DRIVER" '
  $1 == "driver" { driver = driver_override != "" ? driver_override : $2 }
  $1 == "gpu" {
    uuid[$2] = $3
    name = ""
    for (i = 6; i <= NF; i++) if ($i !~ /^(mig|max_slices)=/) name = name (name == "" ? "" : " ") $i
    if (mode == "list") printf "GPU %s: %s (UUID: %s)\n", $2, name, $3
    if (mode == "gpus") printf "%s, %s, %s, 00000000:%02X:00.0, %s, %d, 0, [N/A]\n", $2, $3, name, $2 + 24,
                               driver, $5 / 1048576
  }
  $1 == "proc" && mode == "apps" { d = ($2 in uuid) ? uuid[$2] : $2; printf "%s, %s, %d\n", $4, d, $5 / 1048576 }
' "$FAKE_NVML_CONFIG"
"""


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.getbasetemp() / "fake-nvml")


@pytest.fixture(scope="module")
def fake_smi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bin") / "nvidia-smi"
    path.write_text(FAKE_NVIDIA_SMI)
    path.chmod(0o755)
    return path


def base_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in (CONFIG_ENV, "PYTHONPATH")}
    return env


def run_smoke(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, python: Path | str = sys.executable
) -> subprocess.CompletedProcess:
    """The script run from the checkout, by ``python``."""
    return run_captured([str(python), str(SCRIPT), *args], timeout=timeout, cwd=REPO, env=env or base_env())


def results(out: Path) -> dict:
    return json.loads((out / "gpu-smoke.json").read_text())


def checks_by_name(record: dict) -> dict[str, dict]:
    return {check["name"]: check for check in record["checks"]}


def assert_gone(pid: int) -> None:
    # The smoke reaps its child, so the pid is gone from /proc (not left as a zombie).
    assert not Path(f"/proc/{pid}").exists(), f"the CUDA stand-in {pid} is still there"


# --- the whole flow ------------------------------------------------------------------------------------------


def test_dry_run_passes_and_records_everything(fake_lib: Path, fake_smi: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_smoke(
        "--out",
        str(out),
        "--dry-run-fake-nvml",
        str(fake_lib),
        "--nvidia-smi",
        str(fake_smi),
        "--alloc-mib",
        "256",
        "--tenants",
        "0",
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    record = results(out)
    assert record["status"] == "pass" and record["exit_code"] == 0 and record["mode"] == "dry-run"

    checks = checks_by_name(record)
    assert list(checks) == [
        "nvml-lists-process",
        "nvml-memory",
        "pid-namespace",
        "auditor-exit",
        "auditor-finding",
        "finding-memory",
        "finding-device",
        "summary-gpus",
        "repeatable",
        "nvidia-smi-agrees",
        "instance-ids",
        "process-gone",
    ]
    assert {check["status"] for check in checks.values()} == {"pass"}
    assert "nvidia-smi" in checks["finding-device"]["detail"]  # the compute-apps row was found and compared

    allocated = 256 * MIB
    cuda = record["cuda_process"]
    assert cuda["backend"] == "fake" and cuda["recognised_by"] == "pid"
    assert cuda["nvml_pid"] == cuda["pid"]
    assert cuda["nvml_device"] == fake_gpu_uuid(0) == cuda["device_uuid"]
    assert cuda["nvml_memory_bytes"] == allocated + smoke.FAKE_CONTEXT_BYTES
    assert cuda["overhead_bytes"] == smoke.FAKE_CONTEXT_BYTES
    assert cuda["expected_kind"] == "unattributed-process"
    assert_gone(cuda["pid"])

    report = record["auditor"]["report"]
    assert report["node"] == "smoke"
    assert report["summary"]["gpus"] == smoke.FAKE_GPU_COUNT
    by_pid = {finding["pid"]: finding for finding in report["findings"]}
    assert by_pid[cuda["pid"]]["kind"] == "unattributed-process"
    assert by_pid[cuda["pid"]]["memory_bytes"] == allocated + smoke.FAKE_CONTEXT_BYTES
    assert by_pid[1]["gpu"] == fake_gpu_uuid(smoke.FAKE_GPU_COUNT - 1)  # the process that was there before
    assert record["auditor"]["finding"] == by_pid[cuda["pid"]]
    assert record["auditor"]["command"][1:5] == ["-P", "-m", "gpu_fence.auditor.cli", "once"]
    # 5 `once` runs and 1 + 5 in-process cycles: one List each; each of the 6 auditors asks for the offer at start
    assert record["auditor"]["kubelet_calls"] == {"List": 5 + 6, "GetAllocatableResources": 6}
    assert [run["exit_code"] for run in record["auditor"]["runs"]] == [1] * 5

    timing = record["timing"]
    assert len(timing["once_seconds"]) == 5 and len(timing["cycle_seconds"]) == 5
    assert timing["once_median_seconds"] in timing["once_seconds"]
    assert timing["cycle_median_seconds"] in timing["cycle_seconds"]

    env = record["environment"]
    assert env["driver_version"] == "550.163.01"
    assert env["nvidia_smi"]["list"]["stdout"].startswith(f"GPU 0: {smoke.FAKE_GPU_NAME} (UUID: {fake_gpu_uuid(0)})")
    assert [m["mig_enabled"] for m in env["mig"]] == [False] * smoke.FAKE_GPU_COUNT
    assert env["nvidia_ml_py"]
    raw = [row for row in record["nvml_raw_compute_processes"] if row.get("pid") == cuda["pid"]]
    assert raw and raw[0]["gpu_instance_id"] == smoke.NO_INSTANCE

    summary = (out / "gpu-smoke.md").read_text()
    assert "**PASS** (exit 0)" in summary
    for name in checks:
        assert f"| {name} | pass |" in summary


@pytest.mark.parametrize(
    ("fault", "failing"),
    [
        ("short-memory", {"nvml-memory", "finding-memory"}),
        ("unlisted", {"nvml-lists-process", "auditor-finding", "repeatable"}),
    ],
)
def test_a_fake_that_misreports_fails_the_checks_it_breaks(
    fake_lib: Path, tmp_path: Path, fault: str, failing: set[str]
) -> None:
    out = tmp_path / "out"
    done = run_smoke(
        "--out",
        str(out),
        "--dry-run-fake-nvml",
        str(fake_lib),
        "--dry-run-fault",
        fault,
        "--runs",
        "1",
        "--alloc-mib",
        "64",
        "--tenants",
        "0",
    )
    assert done.returncode == 1, done.stderr
    record = results(out)
    assert record["status"] == "fail"
    failed = {name for name, check in checks_by_name(record).items() if check["status"] == "fail"}
    assert failed == failing
    first_failure = next(line for line in done.stderr.splitlines() if "FAILED" in line)
    assert all(name in first_failure for name in failing)
    assert "**FAIL** (exit 1)" in (out / "gpu-smoke.md").read_text()
    assert_gone(record["cuda_process"]["pid"])


def test_nvidia_smi_that_disagrees_with_nvml_fails(fake_lib: Path, fake_smi: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = base_env() | {"FAKE_SMI_DRIVER": "999.1"}
    done = run_smoke(
        "--out",
        str(out),
        "--dry-run-fake-nvml",
        str(fake_lib),
        "--nvidia-smi",
        str(fake_smi),
        "--runs",
        "1",
        "--alloc-mib",
        "64",
        "--tenants",
        "0",
        env=env,
    )
    assert done.returncode == 1, done.stderr
    check = checks_by_name(results(out))["nvidia-smi-agrees"]
    assert check["status"] == "fail"
    assert "999.1" in check["detail"] and "550.163.01" in check["detail"]


def test_an_installed_tests_package_does_not_hide_the_fakes(fake_lib: Path, tmp_path: Path) -> None:
    # Some distributions ship a top-level ``tests`` package; a regular package beats this checkout's namespace one.
    shadow = tmp_path / "site" / "tests"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    env = base_env() | {"PYTHONPATH": os.pathsep.join([str(REPO), str(shadow.parent)])}
    out = tmp_path / "out"
    done = run_smoke("--out", str(out), "--dry-run-fake-nvml", str(fake_lib), "--runs", "1", "--tenants", "2", env=env)
    assert done.returncode == 0, done.stderr
    assert "tenants-named" in checks_by_name(results(out))  # the API fake, which imports tests.fakes.http_listener


# --- the CUDA driver API path, against a fake libcuda.so.1 ---------------------------------------------------

# The smoke's ctypes code against a C library with the CUDA driver API's signatures. Like the real driver, an
# allocation makes the process show up in NVML: the fake appends a `proc` line to the fake NVML's configuration (and
# a `util` line once the process keeps memsetting, as a busy holder does), and cuMemFree_v2 removes them.
# FAKE_CUDA_FAIL=<function> makes that function answer CUDA_ERROR_OUT_OF_MEMORY (2).
FAKE_LIBCUDA = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
#define CONTEXT_BYTES (300ull << 20)
static int initialised;
static void *current;
static int context_storage;

static int failing(const char *name) {
    const char *fail = getenv("FAKE_CUDA_FAIL");
    return fail != NULL && strcmp(fail, name) == 0;
}

CUresult cuInit(unsigned int flags) { (void)flags; if (failing("cuInit")) return 2; initialised = 1; return 0; }
CUresult cuDriverGetVersion(int *version) { *version = 13000; return 0; }
CUresult cuDeviceGetCount(int *count) { if (!initialised) return 3; *count = 1; return 0; }
CUresult cuDeviceGet(int *device, int ordinal) { if (ordinal != 0) return 101; *device = 0; return 0; }
CUresult cuDeviceGetName(char *name, int length, int device) {
    (void)device; snprintf(name, (size_t)length, "NVIDIA H200"); return 0;
}
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, int device) {
    const char *text = getenv("FAKE_CUDA_UUID");
    int n = 0;
    (void)device;
    if (text == NULL) return 999;
    for (text += 4; *text && n < 16; text++) {
        if (*text == '-') continue;
        sscanf(text, "%2hhx", &uuid[n++]);
        text++;
    }
    return n == 16 ? 0 : 999;
}
CUresult cuDevicePrimaryCtxRetain(void **context, int device) { (void)device; *context = &context_storage; return 0; }
CUresult cuCtxSetCurrent(void *context) { current = context; return 0; }
CUresult cuMemAlloc_v2(unsigned long long *pointer, size_t bytes) {
    FILE *config;
    if (failing("cuMemAlloc_v2")) return 2;
    if (current == NULL) return 201;
    config = fopen(getenv("FAKE_NVML_CONFIG"), "a");
    if (config == NULL) return 999;
    fprintf(config, "proc %s compute %d %llu\n", getenv("FAKE_CUDA_UUID"), (int)getpid(),
            (unsigned long long)bytes + CONTEXT_BYTES);
    fclose(config);
    *pointer = 0x7f0000000000ull;
    return 0;
}
CUresult cuMemsetD8_v2(unsigned long long pointer, unsigned char value, size_t bytes) {
    static int memsets;
    FILE *config;
    (void)value; (void)bytes;
    if (pointer != 0x7f0000000000ull) return 1;
    /* The second memset is a busy holder's: from then on the driver samples the process at 50 %. */
    if (++memsets == 2 && (config = fopen(getenv("FAKE_NVML_CONFIG"), "a")) != NULL) {
        fprintf(config, "util %s %d 50 0 0 0\n", getenv("FAKE_CUDA_UUID"), (int)getpid());
        fclose(config);
    }
    return 0;
}
CUresult cuCtxSynchronize(void) { return current != NULL ? 0 : 201; }
CUresult cuMemFree_v2(unsigned long long pointer) {
    char lines[64][256], kind[32], device[128];
    int count = 0, pid;
    const char *path = getenv("FAKE_NVML_CONFIG");
    FILE *config = fopen(path, "r");
    (void)pointer;
    if (config == NULL) return 999;
    while (count < 64 && fgets(lines[count], sizeof lines[count], config) != NULL) {
        if (sscanf(lines[count], "proc %127s %31s %d", device, kind, &pid) == 3 && pid == (int)getpid()) continue;
        if (sscanf(lines[count], "util %127s %d", device, &pid) == 2 && pid == (int)getpid()) continue;
        count++;
    }
    fclose(config);
    config = fopen(path, "w");
    if (config == NULL) return 999;
    for (int i = 0; i < count; i++) fputs(lines[i], config);
    fclose(config);
    return 0;
}
CUresult cuGetErrorString(CUresult error, const char **text) {
    *text = error == 2 ? "out of memory" : "unknown error";
    return 0;
}
"""


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("libcuda")
    source = directory / "fake_libcuda.c"
    source.write_text(FAKE_LIBCUDA)
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(directory / "libcuda.so.1"),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    return directory


def cuda_env(fake_libcuda: Path, config: Path, **extra: str) -> dict[str, str]:
    env = base_env() | {CONFIG_ENV: str(config), "FAKE_CUDA_UUID": fake_gpu_uuid(0), **extra}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(fake_libcuda), env.get("LD_LIBRARY_PATH")]))
    return env


def test_driver_api_holder_passes_every_check(fake_lib: Path, fake_libcuda: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed: auto would use it instead of the driver API")
    config = FakeNvmlConfig(gpus=(FakeGpu(0), FakeGpu(1))).write(tmp_path / "nvml.conf")
    out = tmp_path / "out"
    # Not a dry run: --cuda auto tries PyTorch (absent), then the driver API, as on a GPU machine without PyTorch.
    done = run_smoke(
        "--out",
        str(out),
        "--nvml-lib",
        str(fake_lib),
        "--alloc-mib",
        "128",
        "--runs",
        "2",
        "--tenants",
        "0",
        env=cuda_env(fake_libcuda, config),
    )
    assert done.returncode == 0, done.stderr
    assert "CUDA through torch failed: PyTorch is not importable" in done.stderr
    record = results(out)
    assert record["mode"] == "real"
    assert {check["status"] for check in record["checks"]} == {"pass", "skip"}
    cuda = record["cuda_process"]
    assert cuda["backend"] == "driver"
    assert cuda["device_uuid"] == fake_gpu_uuid(0)  # cuDeviceGetUuid_v2's bytes, formatted
    assert cuda["device_name"] == "NVIDIA H200" and cuda["cuda_driver_version"] == 13000
    assert cuda["overhead_bytes"] == 300 * MIB
    assert "CUDA" in checks_by_name(record)["finding-device"]["detail"]
    assert checks_by_name(record)["process-gone"]["status"] == "pass"  # cuMemFree_v2 ran on release
    assert "proc " not in config.read_text()
    assert_gone(cuda["pid"])


def test_a_cuda_error_is_named_with_its_text(fake_lib: Path, fake_libcuda: Path, tmp_path: Path) -> None:
    config = FakeNvmlConfig(gpus=(FakeGpu(0),)).write(tmp_path / "nvml.conf")
    done = run_smoke(
        "--out",
        str(tmp_path / "out"),
        "--nvml-lib",
        str(fake_lib),
        "--cuda",
        "driver",
        env=cuda_env(fake_libcuda, config, FAKE_CUDA_FAIL="cuMemAlloc_v2"),
    )
    assert_one_line_cannot_run(done, "driver: cuMemAlloc_v2 failed: CUDA error 2 (out of memory)")


# --- cannot run ----------------------------------------------------------------------------------------------


def assert_one_line_cannot_run(done: subprocess.CompletedProcess, *fragments: str) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gpu-smoke: cannot run: ")
    for fragment in fragments:
        assert fragment in last
    return last


def test_no_nvml_library_exits_2_naming_the_flag(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_smoke("--out", str(out), "--nvml-lib", str(tmp_path / "missing" / "libnvidia-ml.so.1"))
    assert_one_line_cannot_run(done, "no usable NVIDIA driver (library-missing)", "--nvml-lib")
    record = results(out)
    assert record["status"] == "cannot-run" and record["exit_code"] == 2
    assert "library-missing" in record["reason"]
    assert "cuda_process" not in record  # nothing was started
    assert "Could not run" in (out / "gpu-smoke.md").read_text()


def test_driver_not_loaded_exits_2(fake_lib: Path, tmp_path: Path) -> None:
    # The fake answers DRIVER_NOT_LOADED without a configuration, as NVML does on a node without the kernel module.
    done = run_smoke("--out", str(tmp_path / "out"), "--nvml-lib", str(fake_lib))
    assert_one_line_cannot_run(done, "driver-not-loaded", "kernel driver is not loaded")


@pytest.mark.parametrize(
    ("choice", "fragments"),
    [
        ("driver", ("could not start a CUDA process", "driver: cannot load libcuda.so.1")),
        ("auto", ("could not start a CUDA process", "torch: ", "driver: cannot load libcuda.so.1")),
    ],
)
def test_no_cuda_exits_2_with_every_backend_tried(
    fake_lib: Path, tmp_path: Path, choice: str, fragments: tuple[str, ...]
) -> None:
    # A driver NVML can talk to, but no CUDA: this machine has neither libcuda.so.1 nor a CUDA build of PyTorch.
    if importlib.util.find_spec("torch") is not None or os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has CUDA pieces; the no-CUDA path needs a machine without them")
    config = FakeNvmlConfig(gpus=(FakeGpu(0),)).write(tmp_path / "nvml.conf")
    env = base_env() | {CONFIG_ENV: str(config)}
    done = run_smoke("--out", str(tmp_path / "out"), "--nvml-lib", str(fake_lib), "--cuda", choice, env=env)
    assert_one_line_cannot_run(done, *fragments)
    assert results(tmp_path / "out")["environment"]["driver_version"] == "550.163.01"


def test_sigterm_stops_the_cuda_process_and_the_kubelet(fake_lib: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--out", str(out), "--dry-run-fake-nvml", str(fake_lib), "--runs", "200"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=base_env(),
    )
    try:
        pid = wait_for_line(process, "auditing ")  # the CUDA stand-in and the kubelet are both up
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2, stderr
    assert stderr.strip().splitlines()[-1] == "gpu-smoke: cannot run: stopped by SIGTERM"
    record = results(out)
    assert record["status"] == "cannot-run"
    assert_gone(record["cuda_process"]["pid"])
    assert pid == record["cuda_process"]["pid"]
    assert "auditor" not in record  # stopped during the `once` runs
    assert not Path(record["workdir"]).exists()  # the kubelet's socket and the fake's configuration went with it


def wait_for_line(process: subprocess.Popen, marker: str, limit: float = 60) -> int:
    """Read the smoke's progress lines until ``marker``; the CUDA pid it announced."""
    assert process.stderr is not None
    stderr = process.stderr
    announced: list[int] = []

    def marker_read() -> int | None:
        readable, _, _ = select.select([stderr], [], [], 0.1)  # the poll interval: a line wakes it at once
        if not readable:
            return None
        line = stderr.readline()
        if not line:
            raise AssertionError(f"the smoke ended before it printed {marker!r}")
        if "CUDA process pid" in line:
            announced.append(int(line.split("CUDA process pid", 1)[1].split()[0]))
        if marker in line:
            assert announced
            return announced[-1]
        return None

    return wait_for(marker_read, f"the smoke to print {marker!r}", timeout=limit, interval=0)


def test_a_holder_that_ignores_its_closed_stdin_is_terminated_and_reaped() -> None:
    # a CUDA holder stuck in the driver never reads its stdin: stop() must still end it, through the harness's stop
    process = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"], stdin=subprocess.PIPE)
    stopped = []
    try:
        smoke.Holder(process, {}, lambda: stopped.append(True)).stop()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGTERM and stopped == [True]


def test_time_limit_stops_everything_and_exits_2(fake_lib: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_smoke("--out", str(out), "--dry-run-fake-nvml", str(fake_lib), "--runs", "200", "--seconds", "2")
    assert_one_line_cannot_run(done, "passed its --seconds limit")
    record = results(out)
    assert_gone(record["cuda_process"]["pid"])


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ((), "--out DIR is required"),
        (("--out", "x", "--seconds", "0"), "--seconds"),
        (("--out", "x", "--alloc-mib", "lots"), "--alloc-mib"),
        (("--out", "x", "--dry-run-fault", "unlisted"), "--dry-run-fault needs --dry-run-fake-nvml"),
        (("--out", "x", "--dry-run-fake-nvml", "/nonexistent/libnvidia-ml.so.1"), "build_fake_nvml"),
        (("--out", "x", "--cuda", "opencl"), "--cuda"),
    ],
)
def test_usage_errors_exit_2_with_what_to_fix(tmp_path: Path, arguments: tuple[str, ...], fragment: str) -> None:
    done = run_smoke(*(str(tmp_path / a) if a == "x" else a for a in arguments))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert fragment in done.stderr.strip().splitlines()[-1]


def test_unwritable_out_exits_2(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = run_smoke("--out", str(blocker / "out"))
    assert_one_line_cannot_run(done, f"cannot write to --out {blocker / 'out'}")


# --- pure helpers --------------------------------------------------------------------------------------------


@given(st.binary(min_size=16, max_size=16))
def test_cuda_uuid_bytes_format_as_nvml_writes_them(raw: bytes) -> None:
    text = smoke.format_cuda_uuid(raw)
    assert text == f"GPU-{uuid.UUID(bytes=raw)}"
    assert smoke.uuid_body(text) == str(uuid.UUID(bytes=raw))
    assert smoke.match_uuid(str(uuid.UUID(bytes=raw)).upper(), ["GPU-x", text]) == text


def test_cuda_uuid_needs_16_bytes() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        smoke.format_cuda_uuid(b"\x00" * 15)


@pytest.mark.parametrize("text", [None, "", "GPU-", "not-a-uuid", "GPU-0000"])
def test_uuid_body_refuses_what_is_no_uuid(text: str | None) -> None:
    assert smoke.uuid_body(text) is None
    assert smoke.match_uuid(text, [fake_gpu_uuid(0)]) is None


def test_nvidia_smi_list_with_mig_devices() -> None:
    text = (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5e4b8c2a-1111-2222-3333-444455556666)\n"
        "  MIG 3g.20gb     Device  0: (UUID: MIG-0a1b2c3d-1111-2222-3333-444455556666)\n"
        "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-5e4b8c2a-1111-2222-3333-444455557777)\n"
        "Failed to query something\n"
    )
    entries = smoke.parse_smi_list(text)
    assert [(e["kind"], e["uuid"]) for e in entries] == [
        ("gpu", "GPU-5e4b8c2a-1111-2222-3333-444455556666"),
        ("mig", "MIG-0a1b2c3d-1111-2222-3333-444455556666"),
        ("gpu", "GPU-5e4b8c2a-1111-2222-3333-444455557777"),
    ]


def test_nvidia_smi_csv_keeps_rows_of_the_right_width() -> None:
    text = "12, GPU-a, 1536\nWARNING: something\n13, GPU-b, 20\n"
    assert smoke.parse_smi_csv(text, smoke.NVIDIA_SMI_APP_FIELDS) == [
        {"pid": "12", "gpu_uuid": "GPU-a", "used_memory": "1536"},
        {"pid": "13", "gpu_uuid": "GPU-b", "used_memory": "20"},
    ]


def process(pid: int, device: str = "GPU-a", used: int | None = 2 * MIB, kind: str = "compute") -> dict:
    return {"pid": pid, "device_uuid": device, "used_memory_bytes": used, "kind": kind}


def test_own_process_by_pid_else_the_one_new_process_holding_the_allocation() -> None:
    old = process(7, used=10 * MIB)
    assert smoke.find_own_process([old, process(42)], 42, [(7, "GPU-a")], MIB) == (process(42), "pid")
    # Another PID namespace: NVML says 9001 for our 42.
    assert smoke.find_own_process([old, process(9001)], 42, [(7, "GPU-a")], MIB) == (process(9001), "new-process")
    assert smoke.find_own_process([old, process(9001, used=MIB // 2)], 42, [(7, "GPU-a")], MIB) == (None, "absent")
    assert smoke.find_own_process([old, process(9001), process(9002)], 42, [(7, "GPU-a")], MIB) == (None, "ambiguous")


def facts(**overrides) -> object:
    own = process(42, device="GPU-00000000-0000-4000-8000-000000000000", used=3 * MIB)
    report = {
        "summary": {"gpus": 1, "devices": 1},
        "findings": [
            {
                "kind": "unattributed-process",
                "pid": 42,
                "gpu": own["device_uuid"],
                "memory_bytes": 3 * MIB,
                "message": "m",
            }
        ],
    }
    values = {
        "allocated_bytes": 2 * MIB,
        "holder_pid": 42,
        "holder_uuid": None,
        "devices": ({"uuid": own["device_uuid"], "parent_uuid": None, "mig_enabled": False},),
        "driver_version": "580.1",
        "own": own,
        "own_how": "pid",
        "expected_kind": "unattributed-process",
        "expected_why": "its cgroup names no pod",
        "runs": ({"exit_code": 1, "report": report, "stderr": ""},),
        "smi_gpus": None,
        "smi_list": None,
        "smi_apps": None,
        "raw_own": None,
        "gone": True,
    }
    values.update(overrides)
    return smoke.Facts(**values)


def statuses(checks: list) -> dict[str, str]:
    return {check.name: check.status for check in checks}


def test_evaluate_all_good() -> None:
    result = statuses(smoke.evaluate(facts()))
    assert set(result.values()) == {"pass", "skip"}
    assert result["nvidia-smi-agrees"] == "skip"


def test_evaluate_other_pid_namespace_is_a_skip_not_a_failure() -> None:
    own = process(9001, device="GPU-00000000-0000-4000-8000-000000000000", used=3 * MIB)
    report = {
        "summary": {"gpus": 1, "devices": 1},
        "findings": [{"kind": "unattributed-process", "pid": 9001, "gpu": own["device_uuid"], "memory_bytes": 3 * MIB}],
    }
    result = smoke.evaluate(facts(own=own, own_how="new-process", runs=({"exit_code": 1, "report": report},)))
    by_name = {check.name: check for check in result}
    assert by_name["pid-namespace"].status == "skip" and "9001" in by_name["pid-namespace"].detail
    assert by_name["auditor-finding"].status == "pass"


def test_evaluate_wrong_kind_names_the_expected_one() -> None:
    checks = smoke.evaluate(facts(expected_kind="used-unallocated", expected_why="its cgroup names container abc"))
    failed = [check for check in checks if check.status == "fail"]
    assert [check.name for check in failed] == ["auditor-finding"]
    assert "expected used-unallocated" in failed[0].detail and "container abc" in failed[0].detail


def test_evaluate_auditor_that_could_not_audit() -> None:
    runs = ({"exit_code": 2, "report": None, "stderr": "gpu-fence-auditor once: cannot audit: kubelet gone\n"},)
    checks = {check.name: check for check in smoke.evaluate(facts(runs=runs))}
    assert checks["auditor-exit"].status == "fail" and "kubelet gone" in checks["auditor-exit"].detail
    assert checks["auditor-finding"].status == "fail"
    assert checks["repeatable"].status == "fail"


def test_evaluate_device_against_cuda_and_nvidia_smi_on_a_mig_device() -> None:
    card, mig = "GPU-00000000-0000-4000-8000-000000000000", "MIG-00000000-0001-4000-8000-000000000010"
    own = process(42, device=mig, used=3 * MIB)
    report = {
        "summary": {"gpus": 1, "devices": 2},
        "findings": [{"kind": "unattributed-process", "pid": 42, "gpu": mig, "memory_bytes": 3 * MIB}],
    }
    devices = ({"uuid": card, "parent_uuid": None, "mig_enabled": True}, {"uuid": mig, "parent_uuid": card})
    base = {
        "own": own,
        "devices": devices,
        "runs": ({"exit_code": 1, "report": report},),
        "raw_own": {"gpu_instance_id": 7, "compute_instance_id": 0},
    }
    good = {
        c.name: c
        for c in smoke.evaluate(
            facts(**base, holder_uuid=mig[4:], smi_apps=({"pid": "42", "gpu_uuid": card, "used_memory": "3"},))
        )
    }
    assert good["finding-device"].status == "pass"
    assert good["finding-device"].detail.endswith("NVML, CUDA, nvidia-smi report")
    assert good["instance-ids"].status == "info"
    bad = {c.name: c for c in smoke.evaluate(facts(**base, holder_uuid="GPU-99999999-0000-4000-8000-000000000000"))}
    assert bad["finding-device"].status == "fail" and "CUDA says" in bad["finding-device"].detail


def test_evaluate_counts_and_nvidia_smi() -> None:
    listed = (
        {"kind": "gpu", "uuid": "GPU-00000000-0000-4000-8000-000000000000"},
        {"kind": "gpu", "uuid": "GPU-00000001-0000-4000-8000-000000000001"},
    )
    checks = {c.name: c for c in smoke.evaluate(facts(smi_list=listed, smi_gpus=({"driver_version": "580.1"},)))}
    assert checks["summary-gpus"].status == "fail" and "nvidia-smi -L 2" in checks["summary-gpus"].detail
    assert checks["nvidia-smi-agrees"].status == "fail" and "GPU UUIDs differ" in checks["nvidia-smi-agrees"].detail


def test_evaluate_process_that_stays_listed_after_exit() -> None:
    assert statuses(smoke.evaluate(facts(gone=False)))["process-gone"] == "fail"


def test_markdown_of_a_cannot_run_record() -> None:
    record = {
        "status": "cannot-run",
        "exit_code": 2,
        "started": "t0",
        "finished": "t1",
        "duration_seconds": 0.1,
        "reason": "no usable NVIDIA driver (driver-not-loaded): ...",
        "checks": [],
    }
    text = smoke.summary_markdown(record)
    assert "**CANNOT-RUN** (exit 2)" in text and "Could not run: no usable NVIDIA driver" in text


# --- the tenants scenario ------------------------------------------------------------------------------------

TENANT_CHECKS = ["named", "memory", "unallocated", "allocated"]


@pytest.mark.parametrize("hierarchy", ["v2", "v1", "hybrid"])
def test_tenants_in_kubelet_shaped_cgroups_are_named_metered_and_time_sliced(
    fake_lib: Path, tmp_path: Path, hierarchy: str
) -> None:
    out = tmp_path / "out"
    done = run_smoke(
        "--out", str(out), "--dry-run-fake-nvml", str(fake_lib), "--runs", "2", "--dry-run-cgroup", hierarchy
    )
    assert done.returncode == 0, done.stderr
    record = results(out)
    checks = checks_by_name(record)
    names = [f"tenants-{name}" for name in (*TENANT_CHECKS, "activity", "cleanup")]
    assert [name for name in checks if name.startswith("tenants-")] == names
    assert {checks[name]["status"] for name in names} == {"pass"}
    assert "mps-named" not in checks  # --mps not given

    entry = record["tenants"]["time-slicing"]
    assert f"cgroup {hierarchy} host" in entry["placement"]
    gpu, pids = entry["gpu"], entry["pids"]
    last = entry["cycles"][-1]
    rows = {row["pod"]: row for row in last["report"]["containers"] if row["namespace"] == "smoke-time-slicing"}
    tenants = {tenant["pod"]: tenant for tenant in entry["tenants"]}
    assert set(rows) == set(tenants) == {"tenant-a", "tenant-b", "tenant-c"}
    for pod, row in rows.items():
        assert (row["pod_uid"], row["container_id"]) == (tenants[pod]["uid"], tenants[pod]["container_id"])
        nvml = next(size for pid, device, size in last["nvml"] if pid == pids[pod] and device == gpu)
        assert row["memory_bytes"] == {gpu: nvml} == {gpu: tenants[pod]["nbytes"] + smoke.FAKE_CONTEXT_BYTES}
    assert [rows[pod]["gpu_activity"][gpu]["sm"] for pod in ("tenant-a", "tenant-b", "tenant-c")] == [0.6, 0.35, 0.0]
    unallocated = [f for f in last["report"]["findings"] if f["kind"] == "used-unallocated"]
    assert [(f["pod"], f["memory_bytes"]) for f in unallocated] == [("tenant-c", rows["tenant-c"]["memory_bytes"][gpu])]
    assert entry["once"]["exit_code"] == 1 and entry["cgroups_left"] == [] and entry["gone"] is True
    for pid in pids.values():
        assert_gone(pid)
    summary = (out / "gpu-smoke.md").read_text()
    assert "## Tenants, time-slicing" in summary and "| tenant-a | systemd-containerd | replica 0 | busy |" in summary


FAKE_MPS_CONTROL = r"""#!/bin/sh
# A stand-in for nvidia-cuda-mps-control: -d starts "the daemon", a command on stdin is told to it; each is logged
# with the pipe folder it was given.
if [ "$1" = "-d" ]; then
  echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "$FAKE_MPS_LOG"
  exit "${FAKE_MPS_START_EXIT:-0}"
fi
read -r command
echo "$command $CUDA_MPS_PIPE_DIRECTORY" >> "$FAKE_MPS_LOG"
"""


@pytest.fixture
def fake_mps_control(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "nvidia-cuda-mps-control"
    path.parent.mkdir()
    path.write_text(FAKE_MPS_CONTROL)
    path.chmod(0o755)
    return path


def mps_dry_run(out: Path, fake_lib: Path, control: Path) -> list[str]:
    """The arguments of a dry run of every scenario, MPS with the stand-in control daemon."""
    return [
        "--out",
        str(out),
        "--dry-run-fake-nvml",
        str(fake_lib),
        "--runs",
        "1",
        "--mps",
        "--mps-control",
        str(control),
    ]


def test_mps_clients_activity_is_unknown_and_the_daemon_is_started_and_stopped(
    fake_lib: Path, fake_mps_control: Path, tmp_path: Path
) -> None:
    out, log = tmp_path / "out", tmp_path / "mps.log"
    done = run_smoke(*mps_dry_run(out, fake_lib, fake_mps_control), env=base_env() | {"FAKE_MPS_LOG": str(log)})
    assert done.returncode == 0, done.stderr
    record = results(out)
    checks = checks_by_name(record)
    names = [f"mps-{name}" for name in (*TENANT_CHECKS, "daemon", "lists", "activity-unknown", "samples", "cleanup")]
    assert [name for name in checks if name.startswith("mps-")] == names
    assert {checks[name]["status"] for name in names} == {"pass"}

    entry = record["tenants"]["mps"]
    pipe = log.read_text().split()[1]
    assert log.read_text().splitlines() == [f"start {pipe}", f"quit {pipe}"]  # started, then told to quit
    assert {process["mps_pipe"] for process in entry["cuda_processes"]} == {pipe}  # every tenant is its client
    gpu, pids = entry["gpu"], entry["pids"]
    for cycle in entry["cycles"]:
        rows = [row for row in cycle["report"]["containers"] if row["namespace"] == "smoke-mps"]
        assert [(row["gpu_activity"], row["gpu_activity_unknown"]) for row in rows] == [({}, {gpu: "mps"})] * 3
    (server,) = entry["servers"]
    assert server["name"] == "nvidia-cuda-mps-server" and server["bytes"] == smoke.FAKE_MPS_SERVER_BYTES
    assert entry["sampled_pids"] == [server["pid"]]  # the busy clients' samples, all under the server's pid
    assert {int(pid) for pid in entry["lists"]["mps"]} == set(pids.values())
    assert entry["servers_gone"] is True and entry["stop"]["exit_code"] == 0
    assert "unknown (mps), unknown (mps)" in (out / "gpu-smoke.md").read_text()


def test_an_mps_daemon_that_does_not_start_fails_its_round_and_spares_the_other(
    fake_lib: Path, fake_mps_control: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    env = base_env() | {"FAKE_MPS_LOG": str(tmp_path / "mps.log"), "FAKE_MPS_START_EXIT": "1"}
    done = run_smoke(
        "--out",
        str(out),
        "--dry-run-fake-nvml",
        str(fake_lib),
        "--runs",
        "1",
        "--tenants",
        "2",
        "--mps",
        "--mps-control",
        str(fake_mps_control),
        env=env,
    )
    assert done.returncode == 1, done.stderr
    checks = checks_by_name(results(out))
    assert (
        checks["mps-setup"]["status"] == "fail"
        and "did not start the MPS control daemon" in checks["mps-setup"]["detail"]
    )
    assert checks["tenants-memory"]["status"] == "pass"
    assert "mps-setup" in done.stderr.splitlines()[-2]


# --- a plain install: the project installed from its wheel, the smoke run from the checkout ------------------


@pytest.fixture(scope="module")
def plain_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python where gpu-fence is installed as ``pip install .`` installs it (its wheel, not editable), with this
    environment's other packages beside it (a ``.pth`` naming this site-packages: the ``.pth`` files in there, the
    editable install's among them, are not run for a folder a ``.pth`` names)."""
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    venv = tmp_path_factory.mktemp("plain") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = sysconfig.get_path("purelib")
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(own, "test-environment.pth").write_text(purelib + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index", wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return python


@pytest.mark.parametrize("pythonpath", ["", str(REPO)], ids=["clean", "checkout-on-pythonpath"])
def test_a_plain_install_runs_the_whole_dry_run_from_the_checkout(
    plain_python: Path, fake_lib: Path, fake_mps_control: Path, tmp_path: Path, pythonpath: str
) -> None:
    """Run from the checkout, the checkout's gpu_fence/ folder must not hide the installed package (it holds no
    auditor: auditor/ installs as gpu_fence.auditor); not even when the old advice, PYTHONPATH=., was followed."""
    out = tmp_path / "out"
    env = base_env() | {"FAKE_MPS_LOG": str(tmp_path / "mps.log")} | ({"PYTHONPATH": pythonpath} if pythonpath else {})
    done = run_smoke(*mps_dry_run(out, fake_lib, fake_mps_control), env=env, timeout=300, python=plain_python)
    assert done.returncode == 0, done.stderr
    record = results(out)
    installed = record["environment"]["gpu_fence_from"]
    assert installed.startswith(str(plain_python.parents[1])) and installed.endswith("gpu_fence/auditor")
    assert {check["status"] for check in record["checks"]} == {"pass", "skip"}
    assert [run["exit_code"] for run in record["auditor"]["runs"]] == [1]  # the auditor ran as a child, too


# --- placing processes in cgroups ----------------------------------------------------------------------------


def tenant(layout: str = "systemd-containerd") -> object:
    return smoke.Tenant("tenant-a", layout, 0, "busy", MIB, "0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9", "ab" * 32)


def hybrid_host(root: Path) -> tuple[str, str]:
    """A hybrid host's cgroup mounts under ``root`` (``/proc/self/mountinfo``), with this process's own cgroups
    (``/proc/self/cgroup``): in a job's memory cgroup, at the top of every other hierarchy."""
    mounts = {
        "cpu,cpuacct": "rw,cpu,cpuacct",
        "memory": "rw,memory",
        "cpuset": "rw,cpuset",
        "systemd": "rw,xattr,name=systemd",
    }
    lines = [f"31 23 0:28 / {root} rw - tmpfs tmpfs rw"]
    for number, (name, options) in enumerate(mounts.items()):
        (root / name).mkdir(parents=True)
        (root / name / "cgroup.procs").write_text("")
        lines.append(f"{40 + number} 31 0:{30 + number} / {root / name} rw,relatime - cgroup cgroup {options}")
    (root / "unified").mkdir()
    (root / "unified" / "cgroup.procs").write_text("")
    lines.append(f"49 31 0:39 / {root / 'unified'} rw,relatime - cgroup2 cgroup2 rw")
    (root / "memory" / "job" / "7").mkdir(parents=True)
    (root / "memory" / "job" / "7" / "cgroup.procs").write_text("")
    membership = "9:name=systemd:/\n4:memory:/job/7\n3:cpuset:/\n2:cpu,cpuacct:/\n0::/\n"
    return "\n".join(lines) + "\n", membership


def test_the_tenants_go_below_the_smokes_own_cgroup_in_every_hierarchy_but_cpuset(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    hierarchies = smoke.own_cgroups(*hybrid_host(root))
    assert hierarchies == [root / "cpu,cpuacct", root / "memory" / "job" / "7", root / "systemd", root / "unified"]
    tree = smoke.CgroupTree(hierarchies)

    tree.place(tenant(), 4242, {})
    scope = (
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1c2d3e_4f50_4617_8293_a4b5c6d7e8f9.slice/"
        f"cri-containerd-{'ab' * 32}.scope"
    )
    for hierarchy in hierarchies:
        assert (hierarchy / tree.top / scope / "cgroup.procs").read_text() == "4242\n"
    assert not (root / "cpuset" / tree.top).exists()
    other = smoke.Tenant("tenant-b", "cgroupfs", 1, "busy", MIB, "00000000-0000-4000-8000-000000000000", "cd" * 32)
    tree.place(other, 4243, {})
    pod = root / "memory" / "job" / "7" / tree.top / "kubepods" / "burstable" / f"pod{other.uid}"
    assert (pod / ("cd" * 32) / "cgroup.procs").read_text() == "4243\n"

    for hierarchy in hierarchies:  # as the kernel has it once the processes exited: nothing in the way of rmdir
        for procs in (hierarchy / tree.top).rglob("cgroup.procs"):
            procs.unlink()
    assert tree.close() == []
    assert all(not (hierarchy / tree.top).exists() for hierarchy in hierarchies)
    assert (root / "memory" / "job" / "7").is_dir()  # only what the smoke made is removed


def test_a_v2_host_has_one_hierarchy_and_none_is_a_clear_failure(tmp_path: Path) -> None:
    (tmp_path / "user.slice").mkdir()
    (tmp_path / "user.slice" / "cgroup.procs").write_text("")
    mountinfo = f"30 23 0:27 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    assert smoke.own_cgroups(mountinfo, "0::/user.slice\n") == [tmp_path / "user.slice"]
    assert smoke.own_cgroups(mountinfo.replace(" / ", " /other "), "0::/user.slice\n") == []  # another part of the tree
    with pytest.raises(smoke.RoundFailed, match="run as root on a host whose cgroup file system is writable"):
        smoke.CgroupTree([]).place(tenant(), 4242, {})


def writable_cgroups() -> bool:
    try:
        hierarchies = smoke.CgroupTree().hierarchies
    except OSError:
        return False
    return os.geteuid() == 0 and bool(hierarchies) and all(os.access(h, os.W_OK) for h in hierarchies)


@pytest.mark.skipif(not writable_cgroups(), reason="needs root and a writable cgroup file system (the real run's path)")
@pytest.mark.parametrize("layout", ["systemd-containerd", "cgroupfs", "systemd-crio"])
def test_a_real_process_placed_by_the_smoke_is_read_back_by_the_auditor(layout: str) -> None:
    """The real run's placement on this host's cgroup file system (below this process's own cgroups), read back as
    the auditor reads /proc."""
    from gpu_fence.auditor.hostproc import HostProc

    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    tree = smoke.CgroupTree()
    try:
        tree.place(tenant(layout), process.pid, {})
        identity = HostProc("/proc").identity(process.pid)
        assert identity is not None and (identity.pod_uid, identity.container_id) == (tenant().uid, "ab" * 32)
        assert f"/{tree.top}/" in Path(f"/proc/{process.pid}/cgroup").read_text()
    finally:
        process.communicate(b"", timeout=30)
        left = tree.close()
    assert left == []
    assert not any((hierarchy / tree.top).exists() for hierarchy in tree.hierarchies)


# --- a round's verdicts --------------------------------------------------------------------------------------

GPU = "GPU-00000000-0000-4000-8000-000000000000"


def round_facts(mode: str = "time-slicing", **changes: object) -> object:
    """A round as the dry run makes it: three tenants, three cycles, what the auditor and NVML say in each."""
    tenants = tuple(
        smoke.Tenant(pod, layout, replica, work, MIB, f"uid-{pod}", pod * 4)
        for pod, layout, replica, work, _ in smoke.TENANTS
    )
    pids = {"tenant-a": 11, "tenant-b": 12, "tenant-c": 13}
    sm = {"tenant-a": 0.6, "tenant-b": 0.35, "tenant-c": 0.0}
    namespace = f"smoke-{mode}"

    def row(t: object) -> dict:
        return {
            "namespace": namespace,
            "pod": t.pod,
            "container": "main",
            "pod_uid": t.uid,
            "container_id": t.container_id,
            "identity": "kubernetes",
            "used": [GPU],
            "memory_bytes": {GPU: 2 * MIB},
            "allocation_counts": {GPU: 1} if t.allocated else {},
            "gpu_activity": {} if mode == "mps" else {GPU: {"sm": sm[t.pod]}},
            "gpu_activity_unknown": {GPU: "mps"} if mode == "mps" else {},
        }

    finding = {"kind": "used-unallocated", "pod": "tenant-c", "gpu": GPU, "memory_bytes": 2 * MIB, "message": "m"}
    metrics = (
        [{"name": smoke.UNKNOWN_GAUGE, "labels": {"gpu_uuid": GPU, "reason": "mps"}, "value": 1.0}]
        if mode == "mps"
        else []
    )
    cycle = {
        "report": {"containers": [row(t) for t in tenants], "findings": [finding]},
        "nvml": [(pid, GPU, 2 * MIB) for pid in pids.values()],
        "metrics": metrics,
    }
    mps = None
    if mode == "mps":
        listed = {str(pid): 2 * MIB for pid in pids.values()}
        mps = {
            "start": {"command": ["nvidia-cuda-mps-control", "-d"], "exit_code": 0},
            "stop": {"exit_code": 0},
            "lists": {"compute": listed | {"30": 66 * MIB}, "mps": listed},
            "servers": [{"pid": 30, "bytes": 66 * MIB, "name": "nvidia-cuda-mps-server"}],
            "servers_gone": True,
            "sampled_pids": [30],
        }
    values = {
        "mode": mode,
        "gpu": GPU,
        "tenants": tenants,
        "pids": pids,
        "cycles": (cycle, cycle, cycle),
        "once": {"exit_code": 1, "report": {"findings": [finding]}},
        "gone": True,
        "cgroups_left": (),
        "mps": mps,
    }
    values.update(changes)
    return smoke.RoundFacts(**values)


def verdicts(facts: object) -> dict[str, str]:
    return {check.name: check.status for check in smoke.evaluate_round(facts)}


@pytest.mark.parametrize("mode", ["time-slicing", "mps"])
def test_a_round_as_the_dry_run_makes_it_passes(mode: str) -> None:
    assert set(verdicts(round_facts(mode)).values()) == {"pass"}


def edited(facts: object, edit: object) -> object:
    """``facts`` with ``edit(cycle)`` applied to a deep copy of every cycle."""
    cycles = []
    for cycle in facts.cycles:
        copy = json.loads(json.dumps(cycle))
        edit(copy)
        cycles.append(copy)
    return dataclasses.replace(facts, cycles=tuple(cycles))


def test_memory_that_is_not_nvmls_fails_the_memory_check() -> None:
    def halve(cycle: dict) -> None:
        cycle["report"]["containers"][1]["memory_bytes"][GPU] //= 2

    assert verdicts(edited(round_facts(), halve))["tenants-memory"] == "fail"


def test_time_sliced_shares_that_add_up_past_one_or_an_idle_busy_tenant_fail_the_activity_check() -> None:
    def overlap(cycle: dict) -> None:
        cycle["report"]["containers"][1]["gpu_activity"][GPU]["sm"] = 0.9

    def idle(cycle: dict) -> None:
        cycle["report"]["containers"][0]["gpu_activity"][GPU]["sm"] = 0.0

    def unknown(cycle: dict) -> None:
        cycle["report"]["containers"][2]["gpu_activity"] = {}

    for edit in (overlap, idle, unknown):
        assert verdicts(edited(round_facts(), edit))["tenants-activity"] == "fail"


def test_an_mps_client_with_an_activity_figure_fails_even_when_it_is_zero() -> None:
    """What the auditor exported before it knew: 0 for a busy MPS client."""

    def zero(cycle: dict) -> None:
        cycle["report"]["containers"][0]["gpu_activity"] = {GPU: {"sm": 0.0}}

    def series(cycle: dict) -> None:
        cycle["metrics"].append({"name": smoke.SM_GAUGE, "labels": {"gpu_uuid": GPU}, "value": 0.0})

    for edit in (zero, series):
        assert verdicts(edited(round_facts("mps"), edit))["mps-activity-unknown"] == "fail"


def test_the_unallocated_tenant_must_be_found_with_nvmls_bytes_and_the_allocated_ones_not() -> None:
    def unfound(cycle: dict) -> None:
        cycle["report"]["findings"] = []

    def overreach(cycle: dict) -> None:
        cycle["report"]["findings"].append(
            {"kind": "used-unallocated", "pod": "tenant-a", "gpu": GPU, "memory_bytes": 1, "message": "m"}
        )

    assert verdicts(edited(round_facts(), unfound))["tenants-unallocated"] == "fail"
    assert verdicts(edited(round_facts(), overreach))["tenants-allocated"] == "fail"
    assert verdicts(round_facts(once={"exit_code": 0, "report": {"findings": []}}))["tenants-unallocated"] == "fail"


def test_what_was_left_behind_fails_the_cleanup() -> None:
    assert verdicts(round_facts(cgroups_left=("x: Device or resource busy",)))["tenants-cleanup"] == "fail"
    assert verdicts(round_facts(gone=False))["tenants-cleanup"] == "fail"
    mps = round_facts("mps")
    assert verdicts(dataclasses.replace(mps, mps=mps.mps | {"servers_gone": False}))["mps-cleanup"] == "fail"


def test_a_client_in_one_list_only_or_no_server_fails_the_lists_check_and_stray_samples_are_recorded() -> None:
    mps = round_facts("mps")
    lists = {"compute": {"30": 66 * MIB}, "mps": mps.mps["lists"]["mps"]}
    assert verdicts(dataclasses.replace(mps, mps=mps.mps | {"lists": lists}))["mps-lists"] == "fail"
    assert verdicts(dataclasses.replace(mps, mps=mps.mps | {"servers": []}))["mps-lists"] == "fail"
    assert verdicts(dataclasses.replace(mps, mps=mps.mps | {"sampled_pids": [11, 30]}))["mps-samples"] == "info"
    assert verdicts(dataclasses.replace(mps, mps=mps.mps | {"sampled_pids": []}))["mps-samples"] == "info"


def test_the_smoke_and_the_auditor_it_runs_need_nothing_of_the_webhook(fake_lib: Path, tmp_path: Path) -> None:
    """The GPU machine's Python has PyTorch and nvidia-ml-py, not the webhook's Flask, gunicorn or cryptography:
    a run that cannot import them (here: refused by a sitecustomize that every child loads too) still passes."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in ('flask', 'gunicorn', 'cryptography', 'werkzeug', 'jinja2'):\n"
        "            raise ImportError(f'{name}: not on the GPU machine')\n"
        "sys.meta_path.insert(0, Refuse())\n"
    )
    out = tmp_path / "out"
    env = base_env() | {"PYTHONPATH": str(blocker)}
    done = run_smoke("--out", str(out), "--dry-run-fake-nvml", str(fake_lib), "--runs", "1", "--mps", env=env)
    assert done.returncode == 0, done.stderr
    assert {check["status"] for check in results(out)["checks"]} == {"pass", "skip"}


@pytest.mark.skipif(not writable_cgroups(), reason="needs root and a writable cgroup file system (the real run's path)")
def test_the_real_path_places_busy_tenants_in_this_hosts_cgroups_and_audits_them(
    fake_lib: Path, fake_libcuda: Path, tmp_path: Path
) -> None:
    """Not a dry run: the driver-API holders (against the fake libcuda.so.1, busy with memsets in a thread), placed in
    real cgroups below this process's own, read from the host's /proc by the auditor; only NVML is a fake."""
    config = FakeNvmlConfig(gpus=(FakeGpu(0), FakeGpu(1))).write(tmp_path / "nvml.conf")
    out = tmp_path / "out"
    done = run_smoke(
        "--out",
        str(out),
        "--nvml-lib",
        str(fake_lib),
        "--cuda",
        "driver",
        "--alloc-mib",
        "64",
        "--runs",
        "2",
        env=cuda_env(fake_libcuda, config),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    record = results(out)
    checks = checks_by_name(record)
    assert {checks[f"tenants-{name}"]["status"] for name in (*TENANT_CHECKS, "activity", "cleanup")} == {"pass"}
    entry = record["tenants"]["time-slicing"]
    assert entry["placement"].startswith("real cgroups under ") and entry["cgroups_left"] == []
    assert {process["backend"] for process in entry["cuda_processes"]} == {"driver"}
    shares = {
        row["pod"]: row["gpu_activity"][entry["gpu"]]["sm"]
        for row in entry["cycles"][-1]["report"]["containers"]
        if row["namespace"] == "smoke-time-slicing"
    }
    assert shares == {"tenant-a": 0.5, "tenant-b": 0.5, "tenant-c": 0.0}  # the busy threads' memsets, sampled
    assert "util " not in config.read_text() and "proc " not in config.read_text()
