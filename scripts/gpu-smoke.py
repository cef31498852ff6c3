#!/usr/bin/env python3
"""GPU smoke check: the real auditor against a real NVIDIA driver and a real CUDA process, in one bounded run.

What it does (docs/gpu-smoke.md says why each step matters and what it cannot prove):

1. records the environment: ``nvidia-smi -L`` and ``--query-gpu`` output, NVML's driver version and MIG modes,
   the Python and pynvml versions;
2. starts a CUDA process that allocates a known amount of GPU memory and holds it (PyTorch when importable, else
   the CUDA driver API through ctypes on ``libcuda.so.1``), which signals readiness over a pipe;
3. starts the test suite's fake kubelet (a real PodResources gRPC server) on a temporary unix socket with no
   allocations, and runs ``gpu-fence-auditor once --format json --no-kubernetes`` against it, the real NVML
   and the real ``/proc``;
4. checks that the CUDA process is reported (``unattributed-process``, as it runs in no pod) with at least the
   memory it allocated, on the GPU that NVML, nvidia-smi and CUDA name, and that the report counts the GPUs;
   reads the NVML adapter directly; times the audit; writes ``DIR/gpu-smoke.json`` and ``DIR/gpu-smoke.md``;
5. always stops the CUDA process and the server (also on SIGTERM/SIGINT and when ``--seconds`` runs out).

``--dry-run-fake-nvml LIB`` runs the same flow on a machine without a GPU: NVML is the test suite's fake
``libnvidia-ml.so.1`` (configured by this script), the "CUDA process" a sleeping child that the fake lists.

Exit codes: 0 every check passed (or was skipped with a reason), 1 a check failed (named on stderr and in the
files), 2 the smoke could not run (no driver, no CUDA, time limit, signal), with one line on stderr.

Only the standard library is imported at the top: the CUDA holder child runs without the project, and a checkout
whose dependencies are missing gets a clear exit 2 instead of a traceback.
"""

# ruff: noqa: PLC0415  (project modules are imported inside functions on purpose, see the docstring)
from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMA = 1
MIB = 1 << 20
GIB = 1 << 30

PASS, FAIL, SKIP, INFO = "pass", "fail", "skip", "info"
EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2

NO_INSTANCE = 0xFFFFFFFF  # nvml.h: gpuInstanceId / computeInstanceId of a process on a card not in MIG mode
BACKENDS = ("auto", "torch", "driver")
FAULTS = ("short-memory", "unlisted")

#: The dry run's fake node: what NVML adds to the allocation for the CUDA context (a real H100/H200 shows a few
#: hundred MiB), and a process that was on the GPU before the smoke started, so ours must be told apart from it.
FAKE_CONTEXT_BYTES = 500 * MIB
FAKE_OTHER_PROCESS_BYTES = 256 * MIB
FAKE_GPU_COUNT = 2
FAKE_GPU_NAME = "NVIDIA H200"

NVIDIA_SMI_GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "memory.used",
    "mig.mode.current",
)
NVIDIA_SMI_APP_FIELDS = ("pid", "gpu_uuid", "used_memory")


class CannotRun(Exception):
    """The smoke cannot run here (no driver, no CUDA, the time limit, a signal); the message is the one line."""


class HolderFailed(Exception):
    """One CUDA backend could not allocate and hold the memory; the next backend may."""


@dataclass(frozen=True)
class Check:
    """One verdict: ``status`` is pass, fail, skip (could not be checked here, with why) or info (recorded)."""

    name: str
    status: str
    detail: str


# --- pure helpers ------------------------------------------------------------------------------------------------


def format_cuda_uuid(raw: bytes, prefix: str = "GPU") -> str:
    """The ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` text of the 16 bytes ``cuDeviceGetUuid`` fills in."""
    if len(raw) != 16:
        raise ValueError(f"a CUDA UUID has 16 bytes, got {len(raw)}")
    text = raw.hex()
    return f"{prefix}-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def uuid_body(text: str | None) -> str | None:
    """The 36-character UUID without its ``GPU-``/``MIG-`` prefix, lower case; None when ``text`` has none.

    CUDA and PyTorch print UUIDs with or without the prefix and cannot tell a card from a MIG device by the bytes
    alone, so UUIDs from different tools are compared by their body.
    """
    if not text:
        return None
    body = text.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if body.startswith(prefix):
            body = body[len(prefix) :]
    return body if len(body) == 36 and body.count("-") == 4 else None


def match_uuid(text: str | None, known: Iterable[str]) -> str | None:
    """The UUID in ``known`` (NVML's spelling) that ``text`` names, or None."""
    body = uuid_body(text)
    if body is None:
        return None
    return next((uuid for uuid in known if uuid_body(uuid) == body), None)


def parse_smi_list(text: str) -> list[dict[str, str]]:
    """``nvidia-smi -L``: one entry per card (``kind`` gpu) and per MIG device (``kind`` mig) with its UUID."""
    entries = []
    for line in text.splitlines():
        stripped = line.strip()
        if "(UUID:" not in stripped:
            continue
        uuid = stripped.rsplit("(UUID:", 1)[1].rstrip(")").strip()
        if stripped.startswith("GPU "):
            entries.append({"kind": "gpu", "uuid": uuid, "line": stripped})
        elif stripped.startswith("MIG "):
            entries.append({"kind": "mig", "uuid": uuid, "line": stripped})
    return entries


def parse_smi_csv(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """``nvidia-smi --query-...=<fields> --format=csv,noheader,nounits``: one dict per line with those keys.

    Lines with another number of columns (a warning nvidia-smi printed on stdout) are left out.
    """
    rows = []
    for values in csv.reader(io.StringIO(text), skipinitialspace=True):
        if len(values) == len(fields):
            rows.append(dict(zip(fields, (value.strip() for value in values), strict=True)))
    return rows


def find_own_process(
    processes: Sequence[Mapping[str, Any]],
    holder_pid: int,
    baseline: Iterable[tuple[int, str]],
    allocated: int,
) -> tuple[Mapping[str, Any] | None, str]:
    """The NVML process that is the CUDA holder, and how it was recognised.

    By its pid when NVML reports the pid this process sees; else (the smoke runs in a PID namespace other than the
    one NVML reports, e.g. a container without hostPID) the one process that is new since the baseline and holds
    at least the allocation.
    """
    mine = [process for process in processes if process["pid"] == holder_pid]
    if mine:
        return max(mine, key=lambda process: process["used_memory_bytes"] or 0), "pid"
    before = set(baseline)
    new = [
        process
        for process in processes
        if (process["pid"], process["device_uuid"]) not in before and (process["used_memory_bytes"] or 0) >= allocated
    ]
    if len(new) == 1:
        return new[0], "new-process"
    return None, "ambiguous" if new else "absent"


@dataclass(frozen=True)
class Facts:
    """Everything the checks judge, gathered by the run (plain values, so ``evaluate`` is pure)."""

    allocated_bytes: int
    holder_pid: int
    holder_uuid: str | None  # what CUDA (or PyTorch) said its device is
    devices: tuple[Mapping[str, Any], ...]  # the NVML adapter's devices (asdict of the model's Gpu)
    driver_version: str | None
    own: Mapping[str, Any] | None  # the NVML adapter's process that is the holder
    own_how: str  # pid | new-process | absent | ambiguous
    expected_kind: str  # the finding kind the auditor should give it
    expected_why: str
    runs: tuple[Mapping[str, Any], ...]  # each `once` run: exit_code, report (dict or None), stderr
    smi_gpus: tuple[Mapping[str, str], ...] | None  # None: no nvidia-smi
    smi_list: tuple[Mapping[str, str], ...] | None
    smi_apps: tuple[Mapping[str, str], ...] | None
    raw_own: Mapping[str, Any] | None  # pynvml's own record of the holder (instance ids as NVML gave them)
    gone: bool | None  # NVML stopped listing the holder after it exited; None: not checked


def _finding_for(report: Mapping[str, Any] | None, pid: int) -> Mapping[str, Any] | None:
    for finding in (report or {}).get("findings") or ():
        if finding.get("pid") == pid:
            return finding
    return None


def evaluate(facts: Facts) -> list[Check]:
    """The verdicts, in the order a reader follows them."""
    checks: list[Check] = []
    add = checks.append
    by_uuid = {device["uuid"]: device for device in facts.devices}
    cards = [device for device in facts.devices if device.get("parent_uuid") is None]
    own = facts.own

    if own is None:
        why = (
            "several new processes hold the allocation; stop other GPU work and run again"
            if facts.own_how == "ambiguous"
            else "NVML lists no process for it"
        )
        add(
            Check(
                "nvml-lists-process",
                FAIL,
                f"the CUDA process (pid {facts.holder_pid}) is not in NVML's process lists: {why}",
            )
        )
    else:
        add(Check("nvml-lists-process", PASS, f"NVML lists pid {own['pid']} on {own['device_uuid']} ({own['kind']})"))
        used = own["used_memory_bytes"]
        if used is None:
            add(Check("nvml-memory", FAIL, "NVML reports the process's memory as not available"))
        elif used >= facts.allocated_bytes:
            add(
                Check(
                    "nvml-memory",
                    PASS,
                    f"{used} bytes ≥ {facts.allocated_bytes} allocated; "
                    f"{used - facts.allocated_bytes} bytes of context overhead",
                )
            )
        else:
            add(
                Check(
                    "nvml-memory", FAIL, f"NVML reports {used} bytes, less than the {facts.allocated_bytes} allocated"
                )
            )
        if own["pid"] == facts.holder_pid:
            add(Check("pid-namespace", PASS, "NVML reports the PID this process sees (the host PID namespace)"))
        else:
            add(
                Check(
                    "pid-namespace",
                    SKIP,
                    f"NVML reports pid {own['pid']} for the process this namespace knows "
                    f"as {facts.holder_pid}: the smoke runs outside the PID namespace "
                    "NVML reports (the auditor needs hostPID); recognised as the one new "
                    "process holding the allocation",
                )
            )

    first = facts.runs[0] if facts.runs else None
    codes = [run["exit_code"] for run in facts.runs]
    if not facts.runs:
        add(Check("auditor-exit", FAIL, "the auditor was not run"))
    elif all(code == 1 for code in codes):
        add(Check("auditor-exit", PASS, f"every `once` run exited 1 (findings), {len(codes)} runs"))
    else:
        bad = next(run for run in facts.runs if run["exit_code"] != 1)
        stderr = (bad.get("stderr") or "").strip().splitlines()
        add(
            Check(
                "auditor-exit",
                FAIL,
                f"`once` exit codes {codes}, expected 1 (findings) each"
                + (f"; stderr: {stderr[-1]}" if stderr else ""),
            )
        )

    report = first.get("report") if first else None
    finding = _finding_for(report, own["pid"]) if own is not None else None
    if own is None:
        add(Check("auditor-finding", FAIL, "no NVML process to look for in the report"))
    elif report is None:
        add(Check("auditor-finding", FAIL, "the first `once` run printed no JSON report"))
    elif finding is None:
        add(
            Check(
                "auditor-finding",
                FAIL,
                f"the report has no finding for pid {own['pid']} (expected "
                f"{facts.expected_kind}: {facts.expected_why})",
            )
        )
    elif finding.get("kind") != facts.expected_kind:
        add(
            Check(
                "auditor-finding",
                FAIL,
                f"pid {own['pid']} is reported as {finding.get('kind')}, expected "
                f"{facts.expected_kind} ({facts.expected_why})",
            )
        )
    else:
        add(Check("auditor-finding", PASS, f"{finding['kind']} for pid {own['pid']}: {finding.get('message')}"))

    if finding is not None:
        reported = finding.get("memory_bytes")
        if isinstance(reported, int) and reported >= facts.allocated_bytes:
            add(
                Check(
                    "finding-memory",
                    PASS,
                    f"{reported} bytes ≥ {facts.allocated_bytes} allocated (+{reported - facts.allocated_bytes})",
                )
            )
        else:
            add(
                Check(
                    "finding-memory",
                    FAIL,
                    f"the finding carries {reported} bytes, expected at least {facts.allocated_bytes}",
                )
            )
        add(_device_check(finding.get("gpu"), own, facts, by_uuid))

    if report is not None:
        summary = report.get("summary") or {}
        counts = f"summary.gpus {summary.get('gpus')}, NVML {len(cards)} cards"
        agree = summary.get("gpus") == len(cards) and summary.get("devices") == len(facts.devices)
        smi_cards = None if facts.smi_list is None else [e for e in facts.smi_list if e["kind"] == "gpu"]
        if smi_cards is not None:
            counts += f", nvidia-smi -L {len(smi_cards)} GPUs"
            agree = agree and len(smi_cards) == len(cards)
        add(Check("summary-gpus", PASS if agree and cards else FAIL, counts))

    if facts.runs:
        seen = [_finding_for(run.get("report"), own["pid"]) is not None if own else False for run in facts.runs]
        add(
            Check(
                "repeatable",
                PASS if all(seen) else FAIL,
                f"the finding is in {sum(seen)} of {len(seen)} `once` reports",
            )
        )

    if facts.smi_list is None:
        add(Check("nvidia-smi-agrees", SKIP, "no nvidia-smi on this machine"))
    else:
        smi = {e["uuid"] for e in facts.smi_list if e["kind"] == "gpu"}
        nvml = {device["uuid"] for device in cards}
        versions = {row.get("driver_version") for row in facts.smi_gpus or ()}
        problems = []
        if smi != nvml:
            problems.append(f"GPU UUIDs differ: nvidia-smi {sorted(smi)}, NVML {sorted(nvml)}")
        if versions and versions != {facts.driver_version}:
            problems.append(
                f"driver version: nvidia-smi {sorted(v or '' for v in versions)}, NVML {facts.driver_version}"
            )
        add(
            Check(
                "nvidia-smi-agrees",
                FAIL if problems else PASS,
                "; ".join(problems) or f"{len(smi)} GPU UUIDs and driver {facts.driver_version} match",
            )
        )

    if facts.raw_own is not None and own is not None:
        device = by_uuid.get(own["device_uuid"]) or {}
        ids = (facts.raw_own.get("gpu_instance_id"), facts.raw_own.get("compute_instance_id"))
        if device.get("parent_uuid") is None and not device.get("mig_enabled"):
            status = PASS if ids == (NO_INSTANCE, NO_INSTANCE) else INFO
            add(Check("instance-ids", status, f"instance ids {ids} on a card not in MIG mode (nvml.h: 0xFFFFFFFF)"))
        else:
            add(Check("instance-ids", INFO, f"instance ids {ids} on a MIG device"))

    if facts.gone is None:
        add(Check("process-gone", SKIP, "not checked"))
    else:
        add(
            Check(
                "process-gone",
                PASS if facts.gone else FAIL,
                "NVML stopped listing the process after it exited"
                if facts.gone
                else "NVML still lists the process after it exited",
            )
        )
    return checks


def _device_check(gpu: str | None, own: Mapping[str, Any], facts: Facts, by_uuid: Mapping[str, Any]) -> Check:
    problems, sources = [], ["NVML"]
    if gpu != own["device_uuid"]:
        problems.append(f"the finding names {gpu}, NVML {own['device_uuid']}")
    # On a MIG device, CUDA (before cuDeviceGetUuid_v2) and nvidia-smi's process list may name the card instead.
    device = by_uuid.get(own["device_uuid"]) or {}
    allowed = [uuid for uuid in (own["device_uuid"], device.get("parent_uuid")) if uuid]
    if facts.holder_uuid:
        sources.append("CUDA")
        if match_uuid(facts.holder_uuid, allowed) is None:
            problems.append(f"CUDA says its device is {facts.holder_uuid}")
    if facts.smi_apps:
        row = next((r for r in facts.smi_apps if r.get("pid") == str(own["pid"])), None)
        if row is not None:
            sources.append("nvidia-smi")
            if match_uuid(row.get("gpu_uuid"), allowed) is None:
                problems.append(f"nvidia-smi lists it on {row.get('gpu_uuid')}")
    if problems:
        return Check("finding-device", FAIL, "; ".join(problems))
    return Check("finding-device", PASS, f"{gpu}, as {', '.join(sources)} report")


# --- time, signals -------------------------------------------------------------------------------------------


class Deadline:
    """The run's time limit (``--seconds``); steps ask what is left instead of each picking its own timeout."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float:
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise CannotRun("the run passed its --seconds limit")
        return remaining if cap is None else min(cap, remaining)


def poll(predicate: Callable[[], Any], deadline: Deadline, limit: float, every: float = 0.25) -> Any:
    """Call ``predicate`` until it returns something true or ``limit`` seconds pass; its last answer."""
    end = time.monotonic() + deadline.left(limit)
    while True:
        answer = predicate()
        if answer or time.monotonic() >= end:
            return answer
        time.sleep(min(every, max(0.0, end - time.monotonic())))


def _interrupt(signum: int, _frame: Any) -> None:
    raise CannotRun(f"stopped by {signal.Signals(signum).name}")


def _timeout(_signum: int, _frame: Any) -> None:
    raise CannotRun("the run passed its --seconds limit")


# --- the CUDA holder (a child process) -------------------------------------------------------------------------


def hold_main(backend: str, nbytes: int, ready_fd: int, fake_uuid: str | None) -> int:
    """Child: allocate ``nbytes`` on CUDA device 0, say so on ``ready_fd`` (one JSON line), hold until stdin closes.

    stdin is a pipe from the parent, so the child also ends when the parent dies without stopping it.
    """
    with os.fdopen(ready_fd, "w", encoding="utf-8") as ready:
        try:
            info, release = {"torch": _hold_torch, "driver": _hold_driver, "fake": _hold_fake}[backend](
                nbytes, fake_uuid
            )
        except HolderFailed as error:
            ready.write(json.dumps({"ok": False, "error": str(error)}) + "\n")
            return 1
        except Exception as error:  # an unexpected failure is still one line for the parent
            ready.write(json.dumps({"ok": False, "error": f"{type(error).__name__}: {error}"}) + "\n")
            return 1
        ready.write(json.dumps({"ok": True, "pid": os.getpid(), "backend": backend, **info}) + "\n")
    sys.stdin.buffer.read()
    release()
    return 0


def _hold_fake(nbytes: int, fake_uuid: str | None) -> tuple[dict[str, Any], Callable[[], None]]:
    return {"allocated_bytes": nbytes, "device_uuid": fake_uuid, "device_name": FAKE_GPU_NAME}, lambda: None


def _hold_torch(nbytes: int, _fake_uuid: str | None) -> tuple[dict[str, Any], Callable[[], None]]:
    try:
        import torch
    except Exception as error:
        raise HolderFailed(f"PyTorch is not importable: {error}") from None
    if not torch.cuda.is_available():
        raise HolderFailed(f"PyTorch {torch.__version__} sees no CUDA device (a CPU-only build, or no driver)")
    try:
        block = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
        block.zero_()  # touch it, so the memory is committed however the allocator behaves
        torch.cuda.synchronize()
    except Exception as error:
        raise HolderFailed(f"PyTorch could not allocate {nbytes} bytes: {error}") from None
    properties = torch.cuda.get_device_properties(0)
    raw_uuid = getattr(properties, "uuid", None)  # PyTorch 2.x; its text form has varied between releases
    uuid = str(raw_uuid) if raw_uuid is not None and uuid_body(str(raw_uuid)) else None
    uuid_bytes = getattr(raw_uuid, "bytes", None)
    if uuid is None and isinstance(uuid_bytes, bytes | bytearray) and len(uuid_bytes) == 16:
        uuid = format_cuda_uuid(bytes(uuid_bytes))
    info = {
        "allocated_bytes": nbytes,
        "device_uuid": uuid,
        "device_uuid_raw": repr(raw_uuid),
        "device_name": properties.name,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "reserved_bytes": int(torch.cuda.memory_reserved(0)),
    }
    return info, block.data_ptr  # the bound method keeps the block referenced until release


def _hold_driver(nbytes: int, _fake_uuid: str | None) -> tuple[dict[str, Any], Callable[[], None]]:
    """The CUDA driver API through ctypes: no toolkit, no PyTorch, only ``libcuda.so.1`` from the driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise HolderFailed(f"cannot load libcuda.so.1 (the CUDA driver library): {error}") from None
    c_int, c_uint, c_size_t, c_void_p, c_u64 = (
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_uint64,
    )
    signatures: dict[str, list[Any]] = {
        "cuInit": [c_uint],
        "cuDriverGetVersion": [ctypes.POINTER(c_int)],
        "cuDeviceGetCount": [ctypes.POINTER(c_int)],
        "cuDeviceGet": [ctypes.POINTER(c_int), c_int],
        "cuDeviceGetName": [ctypes.c_char_p, c_int, c_int],
        "cuDevicePrimaryCtxRetain": [ctypes.POINTER(c_void_p), c_int],
        "cuCtxSetCurrent": [c_void_p],
        "cuMemAlloc_v2": [ctypes.POINTER(c_u64), c_size_t],
        "cuMemsetD8_v2": [c_u64, ctypes.c_ubyte, c_size_t],
        "cuCtxSynchronize": [],
        "cuMemFree_v2": [c_u64],
        "cuGetErrorString": [c_int, ctypes.POINTER(ctypes.c_char_p)],
    }
    for name, argtypes in signatures.items():
        function = getattr(cuda, name)
        function.argtypes, function.restype = argtypes, c_int

    def call(name: str, *args: Any) -> None:
        result = getattr(cuda, name)(*args)
        if result != 0:
            text = ctypes.c_char_p()
            described = cuda.cuGetErrorString(result, ctypes.byref(text)) == 0 and text.value
            raise HolderFailed(
                f"{name} failed: CUDA error {result}"
                + (f" ({text.value.decode(errors='replace')})" if described else "")
            )

    call("cuInit", 0)
    version, count, device = c_int(), c_int(), c_int()
    call("cuDriverGetVersion", ctypes.byref(version))
    call("cuDeviceGetCount", ctypes.byref(count))
    if count.value < 1:
        raise HolderFailed("the CUDA driver sees no device (CUDA_VISIBLE_DEVICES?)")
    call("cuDeviceGet", ctypes.byref(device), 0)
    name = ctypes.create_string_buffer(256)
    call("cuDeviceGetName", name, 256, device)
    uuid = None
    for symbol in ("cuDeviceGetUuid_v2", "cuDeviceGetUuid"):  # _v2 (CUDA 11.4+) names a MIG device, not its card
        function = getattr(cuda, symbol, None)
        if function is None:
            continue
        raw = (ctypes.c_ubyte * 16)()
        function.argtypes, function.restype = [ctypes.c_void_p, c_int], c_int
        if function(ctypes.cast(raw, ctypes.c_void_p), device) == 0:
            uuid = format_cuda_uuid(bytes(raw))
            break
    context, pointer = c_void_p(), c_u64()
    call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
    call("cuCtxSetCurrent", context)
    call("cuMemAlloc_v2", ctypes.byref(pointer), nbytes)
    call("cuMemsetD8_v2", pointer, 0, nbytes)  # commit the pages, however the driver allocates
    call("cuCtxSynchronize")
    info = {
        "allocated_bytes": nbytes,
        "device_uuid": uuid,
        "device_name": name.value.decode(errors="replace"),
        "cuda_driver_version": version.value,
    }
    return info, lambda: cuda.cuMemFree_v2(pointer)


class Holder:
    """The running holder child, as the parent sees it."""

    def __init__(self, process: subprocess.Popen[bytes], info: dict[str, Any], on_stop: Callable[[], None]) -> None:
        self.process = process
        self.info = info
        self._on_stop = on_stop

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        """Close its stdin (it frees and exits), then terminate, then kill; always reaped."""
        process = self.process
        if process.poll() is None:
            with contextlib.suppress(OSError):
                if process.stdin is not None:
                    process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                load_fake("processes").stop(process, grace_s=5)
        self._on_stop()


def start_holder(
    backend: str,
    nbytes: int,
    deadline: Deadline,
    workdir: Path,
    *,
    fake_uuid: str | None = None,
    on_stop: Callable[[], None] = lambda: None,
) -> Holder:
    """Start the holder child and wait for its ready line; ``HolderFailed`` with its reason when it cannot hold."""
    read_fd, write_fd = os.pipe()
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--hold",
        backend,
        "--alloc-bytes",
        str(nbytes),
        "--ready-fd",
        str(write_fd),
    ]
    if fake_uuid:
        command += ["--fake-uuid", fake_uuid]
    stderr_path = workdir / f"holder-{backend}.stderr"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr, pass_fds=(write_fd,)
        )
    os.close(write_fd)
    holder = Holder(process, {}, on_stop)
    try:
        line = _read_line(read_fd, deadline.left(150))
    except BaseException:
        holder.stop()
        raise
    finally:
        os.close(read_fd)
    if line is None:
        holder.stop()
        tail = stderr_path.read_text(errors="replace").strip().splitlines()
        raise HolderFailed(
            f"the {backend} holder exited without saying it was ready" + (f": {tail[-1]}" if tail else "")
        )
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        holder.stop()
        raise HolderFailed(f"the {backend} holder said {line!r}") from None
    if not message.get("ok"):
        holder.stop()
        raise HolderFailed(str(message.get("error")))
    holder.info = message
    return holder


def _read_line(fd: int, limit: float) -> str | None:
    """One line from ``fd`` within ``limit`` seconds; None at end of file; ``CannotRun`` when the time is up."""
    data = b""
    end = time.monotonic() + limit
    while b"\n" not in data:
        left = end - time.monotonic()
        if left <= 0:
            raise CannotRun(f"the CUDA process did not get ready within {limit:.0f}s")
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace")


# --- the environment -----------------------------------------------------------------------------------------


def run_command(command: Sequence[str], timeout: float) -> dict[str, Any]:
    """A command's output for the record; never raises for the command's own failures."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return {"command": list(command), "missing": True}
    except subprocess.TimeoutExpired:
        return {"command": list(command), "timed_out": timeout}
    return {"command": list(command), "exit_code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(nvidia_smi: str | None, deadline: Deadline) -> dict[str, Any]:
    record: dict[str, Any] = {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "kernel": platform.release(),
        "nvidia_ml_py": _version("nvidia-ml-py"),
        "gpu_fence": _version("gpu-fence"),
        "torch": _version("torch"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "nvidia_visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
        "cgroup": (
            Path("/proc/self/cgroup").read_text(errors="replace") if Path("/proc/self/cgroup").exists() else None
        ),
        "nvidia_smi": None,
    }
    if nvidia_smi:
        record["nvidia_smi"] = {
            "path": nvidia_smi,
            "list": run_command([nvidia_smi, "-L"], deadline.left(30)),
            "query_gpu": run_command(
                [nvidia_smi, f"--query-gpu={','.join(NVIDIA_SMI_GPU_FIELDS)}", "--format=csv,noheader,nounits"],
                deadline.left(30),
            ),
        }
    return record


# --- NVML, read directly -------------------------------------------------------------------------------------


def nvml_snapshot(lib: str | None) -> dict[str, Any]:
    """One NVML adapter snapshot as plain data (opened and closed here, so a fake re-reads its configuration).

    NVML failing after the first snapshot worked (a GPU lost mid-run, the driver unloaded) ends the run.
    """
    from gpu_fence.auditor.nvml import Nvml, NvmlError

    try:
        with Nvml(lib) as nvml:
            snapshot = nvml.snapshot()
    except NvmlError as error:
        raise CannotRun(f"NVML failed during the run ({error.reason}): {error.message}") from None
    return asdict(snapshot)


def load_fake(name: str) -> ModuleType:
    """A module of the test suite's fakes (``podresources_server`` or ``nvml``), loaded from this checkout's file.

    Not imported as ``tests.fakes...``: ``tests`` is a namespace package here, and any installed distribution that
    ships a top-level ``tests`` package (some do) would win the import on a machine with many packages.
    """
    path = REPO / "tests" / "fakes" / (f"{name}.py" if name != "nvml" else "nvml/__init__.py")
    module_name = f"_gpu_smoke_fake_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise CannotRun(f"cannot load {path}: run the smoke from a checkout of the repository")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def raw_compute_processes(lib: str | None) -> list[dict[str, Any]]:
    """pynvml's own compute-process records per card, instance ids included (the adapter hides them)."""
    import pynvml

    from gpu_fence.auditor.nvml import Nvml

    rows: list[dict[str, Any]] = []
    with Nvml(lib):
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError as error:
                rows.append({"gpu_index": index, "error": str(error)})
                continue
            rows.extend(
                {
                    "gpu_index": index,
                    "gpu_uuid": str(uuid),
                    "pid": int(process.pid),
                    "used_gpu_memory": process.usedGpuMemory,
                    "gpu_instance_id": getattr(process, "gpuInstanceId", None),
                    "compute_instance_id": getattr(process, "computeInstanceId", None),
                }
                for process in processes
            )
    return rows


# --- the dry run's fake node -----------------------------------------------------------------------------------


class FakeNode:
    """The fake NVML's configuration, rewritten as the holder starts and stops (what a driver would show)."""

    def __init__(self, workdir: Path, allocated: int, fault: str | None) -> None:
        self.path = workdir / "fake-nvml.conf"
        self.allocated = allocated
        self.fault = fault
        os.environ[load_fake("nvml").CONFIG_ENV] = str(self.path)  # the in-process Nvml and every child read it

    @staticmethod
    def gpu_uuid(index: int) -> str:
        return load_fake("nvml").fake_gpu_uuid(index)

    def write(self, holder_pid: int | None) -> None:
        fakes = load_fake("nvml")
        FakeGpu, FakeNvmlConfig, FakeProcess = fakes.FakeGpu, fakes.FakeNvmlConfig, fakes.FakeProcess
        # pid 1 exists on every Linux host and runs in no pod: a GPU process that was there before the smoke.
        processes = [
            FakeProcess(device=self.gpu_uuid(FAKE_GPU_COUNT - 1), pid=1, used_memory_bytes=FAKE_OTHER_PROCESS_BYTES)
        ]
        if holder_pid is not None and self.fault != "unlisted":
            used = self.allocated // 2 if self.fault == "short-memory" else self.allocated + FAKE_CONTEXT_BYTES
            processes.append(FakeProcess(device=self.gpu_uuid(0), pid=holder_pid, used_memory_bytes=used))
        gpus = tuple(FakeGpu(index=i, name=FAKE_GPU_NAME, memory_total_bytes=141 * GIB) for i in range(FAKE_GPU_COUNT))
        partial = self.path.with_name(self.path.name + ".tmp")
        FakeNvmlConfig(gpus=gpus, processes=tuple(processes)).write(partial)
        partial.replace(self.path)


# --- the auditor ---------------------------------------------------------------------------------------------


def auditor_flags(socket_path: Path, lib: str | None) -> list[str]:
    flags = [
        "--format",
        "json",
        "--no-kubernetes",
        "--pod-resources-socket",
        str(socket_path),
        "--host-proc",
        "/proc",
        "--node",
        "smoke",
    ]
    return flags + (["--nvml-lib", lib] if lib else [])


def child_environment() -> dict[str, str]:
    """Children import the project from this checkout even where it is not installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("GRPC_VERBOSITY", "NONE")
    return env


def run_once(flags: Sequence[str], deadline: Deadline) -> dict[str, Any]:
    """One ``gpu-fence-auditor once`` (as ``python -m gpu_fence.auditor.cli``, the console script's own code), timed."""
    command = [sys.executable, "-m", "gpu_fence.auditor.cli", "once", *flags]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=deadline.left(60),
            check=False,
            cwd=REPO,
            env=child_environment(),
        )
    except subprocess.TimeoutExpired:
        return {"command": command, "exit_code": None, "seconds": None, "report": None, "stderr": "timed out"}
    seconds = time.monotonic() - started
    try:
        report = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        report = None
    return {
        "command": command,
        "exit_code": done.returncode,
        "seconds": round(seconds, 4),
        "report": report,
        "stderr": done.stderr[-4000:],
    }


def time_cycles(flags: Sequence[str], count: int) -> dict[str, Any]:
    """The audit cycle alone (no interpreter start): one auditor, one warm-up cycle, then ``count`` timed ones."""
    from gpu_fence.auditor.cli import build_parser
    from gpu_fence.auditor.collect import CollectError
    from gpu_fence.auditor.daemon import Auditor
    from gpu_fence.auditor.settings import AuditSettings

    args = build_parser().parse_args(["once", *flags])
    auditor = Auditor(AuditSettings.from_args(args))
    samples: list[float] = []
    try:
        auditor.preflight()
        started = time.perf_counter()
        auditor.cycle()
        first = time.perf_counter() - started
        for _ in range(count):
            started = time.perf_counter()
            auditor.cycle()
            samples.append(round(time.perf_counter() - started, 6))
    except CollectError as error:
        return {"error": f"{error.source.value}: {error.reason}", "cycle_seconds": samples}
    finally:
        auditor.close()
    return {
        "first_cycle_seconds": round(first, 6),
        "cycle_seconds": samples,
        "cycle_median_seconds": statistics.median(samples) if samples else None,
    }


def expected_finding(pid: int) -> tuple[str, str]:
    """The finding kind the auditor should give ``pid``, by the same cgroup reading it uses.

    On a plain host the process is in no pod: ``unattributed-process``. If the smoke itself runs inside a
    Kubernetes container, its cgroup names that container, which then holds an unallocated GPU:
    ``used-unallocated``.
    """
    from gpu_fence.auditor.hostproc import HostProc

    identity = HostProc("/proc").identity(pid)
    if identity is None:
        return "unattributed-process", "its cgroup names no pod"
    if identity.container_id is None:
        return "unattributed-process", f"its cgroup names pod {identity.pod_uid} but no container"
    return "used-unallocated", (
        f"its cgroup names container {identity.container_id[:12]} of pod {identity.pod_uid}, which has no allocation"
    )


# --- the run -------------------------------------------------------------------------------------------------


def smoke(
    args: argparse.Namespace, record: dict[str, Any], workdir: Path, deadline: Deadline, stack: contextlib.ExitStack
) -> list[Check]:
    """Steps 1–4; raises ``CannotRun``; the caller's ``finally`` is step 5 for whatever was started."""
    dry_run = args.dry_run_fake_nvml is not None
    lib = args.dry_run_fake_nvml or args.nvml_lib
    nvidia_smi = args.nvidia_smi if args.nvidia_smi is not None else (None if dry_run else shutil.which("nvidia-smi"))
    allocated = args.alloc_mib * MIB
    record["mode"] = "dry-run" if dry_run else "real"
    record["workdir"] = str(workdir)
    record["nvml_lib"] = lib
    record["allocated_bytes"] = allocated
    try:
        import gpu_fence.auditor.nvml  # noqa: F401 - fail here, with the package named, if the project is not importable

        load_fake("podresources_server")  # grpc and the generated PodResources stubs
        load_fake("processes")  # now, so that stopping the CUDA process later cannot fail to load it
    except CannotRun:
        raise
    except Exception as error:  # ImportError, or protobuf's VersionError for stubs newer than its runtime
        raise CannotRun(
            f"cannot import the project ({type(error).__name__}: {error}); run from a checkout with its "
            "dependencies installed (pip install -e .)"
        ) from None

    fake = FakeNode(workdir, allocated, args.dry_run_fault) if dry_run else None
    if fake is not None:
        fake.write(None)  # before anything reads NVML or runs nvidia-smi: both see the fake node
    record["environment"] = environment(nvidia_smi, deadline)

    from gpu_fence.auditor.nvml import Nvml, NvmlError

    try:
        with Nvml(lib):  # the first contact: its failure means there is no driver to smoke-test
            pass
    except NvmlError as error:
        raise CannotRun(f"no usable NVIDIA driver ({error.reason}): {error.message}") from None
    before = nvml_snapshot(lib)
    record["environment"]["driver_version"] = before["driver_version"]
    record["environment"]["mig"] = [
        {"uuid": d["uuid"], "mig_enabled": d["mig_enabled"]} for d in before["devices"] if d["parent_uuid"] is None
    ]
    record["nvml_before"] = before
    progress(f"NVML: driver {before['driver_version']}, {len(before['devices'])} devices")

    holder = start_cuda(args.cuda, allocated, deadline, workdir, fake)
    record["cuda_process"] = dict(holder.info)
    stack.callback(holder.stop)
    progress(f"CUDA process pid {holder.pid} holds {allocated} bytes ({holder.info['backend']})")
    if fake is not None:
        fake.write(holder.pid)

    baseline = [(p["pid"], p["device_uuid"]) for p in before["processes"]]
    seen: dict[str, Any] = {}

    def listed() -> bool:
        seen["snapshot"] = nvml_snapshot(lib)
        own, how = find_own_process(seen["snapshot"]["processes"], holder.pid, baseline, allocated)
        seen["own"], seen["how"] = own, how
        return own is not None

    poll(listed, deadline, limit=2.0 if dry_run else 20.0)
    snapshot, own = seen["snapshot"], seen["own"]
    record["nvml"] = snapshot
    record["cuda_process"].update(
        nvml_pid=own["pid"] if own else None,
        nvml_device=own["device_uuid"] if own else None,
        nvml_memory_bytes=own["used_memory_bytes"] if own else None,
        recognised_by=seen["how"],
        overhead_bytes=(own["used_memory_bytes"] - allocated) if own and own["used_memory_bytes"] is not None else None,
    )
    smi_apps = None
    if nvidia_smi:
        apps = run_command(
            [nvidia_smi, f"--query-compute-apps={','.join(NVIDIA_SMI_APP_FIELDS)}", "--format=csv,noheader,nounits"],
            deadline.left(30),
        )
        record["environment"]["nvidia_smi"]["compute_apps"] = apps
        smi_apps = tuple(parse_smi_csv(apps.get("stdout") or "", NVIDIA_SMI_APP_FIELDS))
    try:
        raw = raw_compute_processes(lib)
    except Exception as error:  # a record, not a verdict: never lose the run over it
        raw = [{"error": f"{type(error).__name__}: {error}"}]
    record["nvml_raw_compute_processes"] = raw
    raw_own = next((row for row in raw if own and row.get("pid") == own["pid"]), None)
    kind, why = expected_finding(own["pid"]) if own else ("unattributed-process", "")
    record["cuda_process"].update(expected_kind=kind, expected_why=why)

    socket_path = workdir / "kubelet.sock"
    kubelet = load_fake("podresources_server").FakeKubelet(socket_path).start()
    stack.callback(kubelet.stop)
    flags = auditor_flags(socket_path, lib)
    progress(f"auditing {args.runs} times: python -m gpu_fence.auditor.cli once {' '.join(flags)}")
    runs = [run_once(flags, deadline) for _ in range(args.runs)]
    cycles = time_cycles(flags, args.runs)
    timed = [run["seconds"] for run in runs if run["seconds"] is not None]
    record["auditor"] = {
        "command": runs[0]["command"] if runs else None,
        "report": runs[0]["report"] if runs else None,
        "runs": [{key: run[key] for key in ("exit_code", "seconds", "stderr")} for run in runs],
        "finding": _finding_for(runs[0]["report"] if runs else None, own["pid"]) if own else None,
        "kubelet_calls": dict(kubelet.calls),
    }
    record["timing"] = {
        "once_seconds": timed,
        "once_median_seconds": statistics.median(timed) if timed else None,
        **cycles,
    }

    holder.stop()
    gone = None
    if own is not None:
        gone = bool(
            poll(
                lambda: all(p["pid"] != own["pid"] for p in nvml_snapshot(lib)["processes"]),
                deadline,
                limit=2.0 if dry_run else 20.0,
            )
        )
    smi = record["environment"]["nvidia_smi"]
    facts = Facts(
        allocated_bytes=allocated,
        holder_pid=holder.pid,
        holder_uuid=holder.info.get("device_uuid"),
        devices=tuple(snapshot["devices"]),
        driver_version=snapshot["driver_version"],
        own=own,
        own_how=seen["how"],
        expected_kind=kind,
        expected_why=why,
        runs=tuple(runs),
        smi_gpus=tuple(parse_smi_csv(smi["query_gpu"].get("stdout") or "", NVIDIA_SMI_GPU_FIELDS)) if smi else None,
        smi_list=tuple(parse_smi_list(smi["list"].get("stdout") or "")) if smi else None,
        smi_apps=smi_apps,
        raw_own=raw_own,
        gone=gone,
    )
    return evaluate(facts)


def start_cuda(choice: str, nbytes: int, deadline: Deadline, workdir: Path, fake: FakeNode | None) -> Holder:
    if fake is not None:
        return start_holder(
            "fake", nbytes, deadline, workdir, fake_uuid=fake.gpu_uuid(0), on_stop=lambda: fake.write(None)
        )
    errors = []
    for backend in ("torch", "driver") if choice == "auto" else (choice,):
        try:
            return start_holder(backend, nbytes, deadline, workdir)
        except HolderFailed as error:
            errors.append(f"{backend}: {error}")
            progress(f"CUDA through {backend} failed: {error}")
    raise CannotRun("could not start a CUDA process: " + "; ".join(errors))


def progress(message: str) -> None:
    print(f"gpu-smoke: {message}", file=sys.stderr, flush=True)


# --- the record ----------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def summary_markdown(record: Mapping[str, Any]) -> str:
    """``gpu-smoke.md``: the verdicts and the facts a reader wants first; the JSON holds everything."""
    env = record.get("environment") or {}
    cuda = record.get("cuda_process") or {}
    timing = record.get("timing") or {}
    mig = ", ".join(f"{m['uuid']} {'on' if m['mig_enabled'] else 'off'}" for m in env.get("mig") or [])
    lines = [
        "# gpu-fence GPU smoke",
        "",
        f"**{record['status'].upper()}** (exit {record['exit_code']}), mode {record.get('mode', '?')}, "
        f"{record['started']} – {record['finished']}, {record['duration_seconds']} s.",
    ]
    if record.get("reason"):
        lines += ["", f"Could not run: {record['reason']}"]
    lines += [
        "",
        "## Environment",
        "",
        f"- NVML driver version: {env.get('driver_version')}; NVML library: {record.get('nvml_lib') or 'default'}",
        f"- Python {env.get('python')}, nvidia-ml-py {env.get('nvidia_ml_py')}, torch {env.get('torch')}",
        f"- MIG mode: {mig or 'unknown'}",
        f"- kernel {env.get('kernel')}; CUDA_VISIBLE_DEVICES={env.get('cuda_visible_devices')}",
    ]
    smi = env.get("nvidia_smi")
    if smi:
        lines += [
            "",
            "```",
            (smi["list"].get("stdout") or "").strip(),
            (smi["query_gpu"].get("stdout") or "").strip(),
            "```",
        ]
    else:
        lines.append("- nvidia-smi: not used")
    if cuda:
        lines += [
            "",
            "## CUDA process",
            "",
            f"- backend {cuda.get('backend')}, pid {cuda.get('pid')} (NVML pid {cuda.get('nvml_pid')}, recognised "
            f"by {cuda.get('recognised_by')}), device {cuda.get('device_name')} {cuda.get('device_uuid')}",
            f"- allocated {record.get('allocated_bytes')} bytes; NVML reports {cuda.get('nvml_memory_bytes')} on "
            f"{cuda.get('nvml_device')}; overhead {cuda.get('overhead_bytes')} bytes",
            f"- expected finding: {cuda.get('expected_kind')} ({cuda.get('expected_why')})",
        ]
    checks = record.get("checks") or []
    if checks:
        lines += ["", "## Checks", "", "| check | status | detail |", "|---|---|---|"]
        lines += [f"| {c['name']} | {c['status']} | {c['detail'].replace('|', '/')} |" for c in checks]
    if timing:
        lines += [
            "",
            "## Timing",
            "",
            f"- `once` (process start to exit): median {timing.get('once_median_seconds')} s of "
            f"{timing.get('once_seconds')}",
            f"- audit cycle in process: median {timing.get('cycle_median_seconds')} s of "
            f"{timing.get('cycle_seconds')} (first cycle, NVML init included: {timing.get('first_cycle_seconds')} s)",
        ]
    problems = (record.get("nvml") or {}).get("problems") or []
    if problems:
        lines += ["", "## NVML problems", ""]
        lines += [f"- {p.get('device') or 'node'}: {p.get('reason')}: {p.get('message')}" for p in problems]
    lines += ["", "What this run does and does not prove: docs/gpu-smoke.md.", ""]
    return "\n".join(lines)


# --- command line --------------------------------------------------------------------------------------------

EPILOG = """\
examples:
  python scripts/gpu-smoke.py --out smoke-results
  python scripts/gpu-smoke.py --out smoke-results --nvml-lib /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1
  python scripts/gpu-smoke.py --out /tmp/smoke --dry-run-fake-nvml build/fake-nvml/libnvidia-ml.so.1

exit codes: 0 all checks passed, 1 a check failed (named on stderr), 2 could not run (no driver, no CUDA, time limit)
"""


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-smoke.py",
        description="Run the gpu-fence auditor against a real NVIDIA driver and a real CUDA process, and record it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", metavar="DIR", help="write gpu-smoke.json and gpu-smoke.md here (created)")
    parser.add_argument("--nvml-lib", metavar="P", help="libnvidia-ml.so.1 to load (default: the library path)")
    parser.add_argument(
        "--seconds",
        type=_positive_int,
        default=150,
        metavar="N",
        help="time limit of the whole run; past it, everything is stopped and it exits 2 (default: 150)",
    )
    parser.add_argument(
        "--alloc-mib",
        type=_positive_int,
        default=1024,
        metavar="MIB",
        help="GPU memory the CUDA process allocates and holds (default: 1024)",
    )
    parser.add_argument(
        "--cuda",
        choices=BACKENDS,
        default="auto",
        help="how to make the CUDA process: torch, the driver API via ctypes, or auto (torch when "
        "importable and working, else the driver API)",
    )
    parser.add_argument(
        "--runs",
        type=_positive_int,
        default=5,
        metavar="N",
        help="`once` runs and timed cycles (default: 5; the timing is their median)",
    )
    parser.add_argument(
        "--nvidia-smi", metavar="P", help="nvidia-smi to compare with (default: nvidia-smi on PATH; none in a dry run)"
    )
    parser.add_argument(
        "--dry-run-fake-nvml",
        metavar="LIB",
        help="no GPU: use this fake libnvidia-ml.so.1 (tests/fakes/nvml, built by build_fake_nvml) "
        "and a sleeping child that the fake lists as the CUDA process",
    )
    parser.add_argument(
        "--dry-run-fault",
        choices=FAULTS,
        help="with --dry-run-fake-nvml: make the fake misreport (short-memory: half the "
        "allocation; unlisted: the process is missing), so the failing path can be tested",
    )
    # The holder child's own arguments (the script re-runs itself as the CUDA process).
    parser.add_argument("--hold", choices=("torch", "driver", "fake"), help=argparse.SUPPRESS)
    parser.add_argument("--alloc-bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--fake-uuid", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.hold:
        return hold_main(args.hold, args.alloc_bytes, args.ready_fd, args.fake_uuid)
    if not args.out:
        parser.error("--out DIR is required")
    if args.dry_run_fault and not args.dry_run_fake_nvml:
        parser.error("--dry-run-fault needs --dry-run-fake-nvml")
    if args.dry_run_fake_nvml and not Path(args.dry_run_fake_nvml).is_file():
        parser.error(
            f"--dry-run-fake-nvml {args.dry_run_fake_nvml} is not a file; build it with "
            "tests.fakes.nvml.build_fake_nvml(DIR)"
        )
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".gpu-smoke-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        print(f"gpu-smoke: cannot run: cannot write to --out {out}: {error.strerror}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # a checkout that is not installed still imports the project

    started = time.monotonic()
    record: dict[str, Any] = {"tool": "gpu-smoke", "schema": SCHEMA, "started": _now(), "argv": sys.argv[1:]}
    checks: list[Check] = []
    reason = None
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGTERM, signal.SIGINT)}
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(args.seconds)
    deadline = Deadline(args.seconds)
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as temporary:
        workdir = Path(temporary)
        stack = contextlib.ExitStack()
        try:
            checks = smoke(args, record, workdir, deadline, stack)
        except CannotRun as error:
            reason = str(error)
        except Exception as error:  # a bug here must still leave the record of a run on a scarce GPU machine
            reason = f"internal error: {type(error).__name__}: {error}"
            record["traceback"] = traceback.format_exc()
        finally:
            # Stopping is bounded (each step has its own timeout); no signal may cut it short.
            signal.alarm(0)
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_IGN)
            stack.close()
            record["holder_stderr"] = {
                path.name: path.read_text(errors="replace")[-4000:] for path in workdir.glob("holder-*.stderr")
            }
    for signum, handler in previous.items():
        signal.signal(signum, handler)

    failed = [check for check in checks if check.status == FAIL]
    if reason is not None:
        status, code = "cannot-run", EXIT_CANNOT_RUN
    elif failed:
        status, code = "fail", EXIT_FAILED
    else:
        status, code = "pass", EXIT_OK
    record.update(
        status=status,
        exit_code=code,
        reason=reason,
        finished=_now(),
        duration_seconds=round(time.monotonic() - started, 3),
        checks=[asdict(c) for c in checks],
    )
    try:
        write_atomically(out / "gpu-smoke.json", json.dumps(record, indent=2, default=str) + "\n")
        write_atomically(out / "gpu-smoke.md", summary_markdown(record))
    except OSError as error:
        print(f"gpu-smoke: cannot write the results to {out}: {error.strerror}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    if reason is not None:
        print(f"gpu-smoke: cannot run: {reason}", file=sys.stderr)
    elif failed:
        print(
            f"gpu-smoke: FAILED: {', '.join(c.name for c in failed)} (details in {out / 'gpu-smoke.md'})",
            file=sys.stderr,
        )
        for check in failed:
            print(f"gpu-smoke:   {check.name}: {check.detail}", file=sys.stderr)
    else:
        print(
            f"gpu-smoke: passed {sum(c.status == PASS for c in checks)} checks "
            f"({sum(c.status == SKIP for c in checks)} skipped); results in {out}",
            file=sys.stderr,
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
