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
   reads the NVML adapter directly; times the audit;
5. the tenants scenario (``--tenants``, 3 by default; needs root): CUDA processes placed in cgroups named as the
   kubelet and its runtime name a container's, a fake kubelet holding time-slicing replicas for all but one, and
   the test suite's API fake naming their pods; checks that each container's bytes are NVML's, that the tenant
   without an allocation is found with its bytes, that their activity shares add up to about 1 at most; with
   ``--mps`` once more as the clients of an MPS control daemon the smoke starts and stops, whose activity must be
   unknown; writes ``DIR/gpu-smoke.json`` and ``DIR/gpu-smoke.md``;
6. always stops every process, server and daemon it started and removes its cgroups (also on SIGTERM/SIGINT and
   when ``--seconds`` runs out).

``--dry-run-fake-nvml LIB`` runs the same flow on a machine without a GPU: NVML is the test suite's fake
``libnvidia-ml.so.1`` (configured by this script), the CUDA processes sleeping children that the fake lists, and
the tenants' ``/proc`` a tree of files the auditor reads instead of the host's (``--dry-run-cgroup``).

The project must be installed for the Python that runs this (``pip install .``; editable or not): the checkout is
never put on ``sys.path``, where its ``gpu_fence/`` folder would hide the installed ``gpu_fence.auditor``.

Exit codes: 0 every check passed (or was skipped with a reason), 1 a check failed (named on stderr and in the
files), 2 the smoke could not run (no driver, no CUDA, time limit, signal), with one line on stderr.

Only the standard library is imported at the top: the CUDA holder child runs without the project, and a Python
without the project or its dependencies gets a clear exit 2 instead of a traceback. The real run imports the
project, its runtime dependencies the auditor needs (nvidia-ml-py, grpcio, protobuf, prometheus-client, kubernetes),
and PyTorch or the CUDA driver library; never Flask, gunicorn or cryptography.
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
import re
import secrets
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
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
WORK = ("idle", "busy")
#: How the dry run's fake /proc writes the tenants' cgroup files: a cgroup v2 host, a v1 one, or a hybrid one.
HIERARCHIES = ("v2", "v1", "hybrid")
NODE = "smoke"
BUSY_MATRIX = 4096  # a busy PyTorch holder multiplies bf16 matrices of this size, back to back

#: The tenants of a round (``--tenants N`` takes the first N - 1 and the last): pod name, cgroup layout (named as the
#: kubelet with the systemd or the cgroupfs driver and containerd or CRI-O name a container's cgroup), the
#: time-slicing replica of the GPU the kubelet allocated it (None: no allocation), what it does, and its allocation
#: as a share of ``--alloc-mib``. The bytes differ, so that a tenant's memory cannot be taken for another's.
TENANTS = (
    ("tenant-a", "systemd-containerd", 0, "busy", 1.0),
    ("tenant-b", "cgroupfs", 1, "busy", 1.5),
    ("tenant-c", "systemd-crio", None, "idle", 0.5),
)
TENANT_CONTAINER = "main"
GPU_RESOURCE = "nvidia.com/gpu"
#: Time-slicing gives each context the card in turn: the tenants' SM shares add up to 1 at most, and a little more
#: for sampling's edges (two busy tenants on an H200: 0.98). A busy tenant's median share is above BUSY_MIN, an idle
#: one's at most that.
TIME_SLICED_SUM_MAX = 1.1
BUSY_MIN = 0.05
CYCLE_INTERVAL_S = 1.0  # between a round's in-process cycles (as `run --interval` paces them)
DRY_CYCLE_INTERVAL_S = 0.25  # the fake driver samples every 0.1 s
#: The series a round's checks read, as docs/metrics.md names them.
SM_GAUGE = "gpu_fence_container_gpu_sm_activity_ratio"
UNKNOWN_GAUGE = "gpu_fence_gpu_activity_unknown"
ROUND_SERIES = frozenset(
    {SM_GAUGE, UNKNOWN_GAUGE, "gpu_fence_gpu_activity_sampled", "gpu_fence_container_gpu_memory_bytes"}
)

#: The dry run's fake node: what NVML adds to the allocation for the CUDA context (a real H100/H200 shows a few
#: hundred MiB), and a process that was on the GPU before the smoke started, so ours must be told apart from it.
FAKE_CONTEXT_BYTES = 500 * MIB
FAKE_OTHER_PROCESS_BYTES = 256 * MIB
FAKE_GPU_COUNT = 2
FAKE_GPU_NAME = "NVIDIA H200"
FAKE_BUSY_SM = (60, 35)  # the fake driver's SM percent for the busy tenants, in turn
FAKE_MPS_SERVER_BYTES = 66 * MIB  # nvidia-cuda-mps-server's own memory on the H200: 69,206,016 bytes

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


def hold_main(backend: str, nbytes: int, ready_fd: int, fake_uuid: str | None, work: str = "idle") -> int:
    """Child: allocate ``nbytes`` on CUDA device 0, say so on ``ready_fd`` (one JSON line), hold until stdin closes;
    with ``work`` busy, keep the GPU busy meanwhile (a thread that runs kernels back to back).

    stdin is a pipe from the parent, so the child also ends when the parent dies without stopping it.
    """
    with os.fdopen(ready_fd, "w", encoding="utf-8") as ready:
        try:
            info, release = {"torch": _hold_torch, "driver": _hold_driver, "fake": _hold_fake}[backend](
                nbytes, fake_uuid, work == "busy"
            )
        except HolderFailed as error:
            ready.write(json.dumps({"ok": False, "error": str(error)}) + "\n")
            return 1
        except Exception as error:  # an unexpected failure is still one line for the parent
            ready.write(json.dumps({"ok": False, "error": f"{type(error).__name__}: {error}"}) + "\n")
            return 1
        # the MPS pipe folder it was started with: a CUDA process with one is a client of the daemon that owns it
        mps_pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
        ready.write(
            json.dumps({"ok": True, "pid": os.getpid(), "backend": backend, "mps_pipe": mps_pipe, **info}) + "\n"
        )
    sys.stdin.buffer.read()
    release()
    return 0


def _hold_fake(nbytes: int, fake_uuid: str | None, _busy: bool) -> tuple[dict[str, Any], Callable[[], None]]:
    return {"allocated_bytes": nbytes, "device_uuid": fake_uuid, "device_name": FAKE_GPU_NAME}, lambda: None


def _keep_busy(step: Callable[[], None], setup: Callable[[], None] = lambda: None) -> Callable[[], None]:
    """Run ``step`` over and over in a thread (after ``setup``, in that thread) until the returned function is
    called; that function stops and joins it. CUDA calls release the GIL, so the main thread still reads stdin."""
    stop = threading.Event()

    def loop() -> None:
        setup()
        while not stop.is_set():
            step()

    thread = threading.Thread(target=loop, name="busy", daemon=True)
    thread.start()

    def halt() -> None:
        stop.set()
        thread.join(timeout=30)

    return halt


def _hold_torch(nbytes: int, _fake_uuid: str | None, busy: bool) -> tuple[dict[str, Any], Callable[[], None]]:
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
    if not busy:
        return info, block.data_ptr  # the bound method keeps the block referenced until release
    # bf16 matrix products back to back, as the tenants of the H200 run did; their buffers are made before the
    # ready line, so that the memory NVML reports stays what it is from then on
    left, right, out = (torch.randn(BUSY_MATRIX, BUSY_MATRIX, dtype=torch.bfloat16, device="cuda:0") for _ in range(3))

    def product() -> None:
        torch.matmul(left, right, out=out)
        torch.cuda.synchronize()

    product()  # the first product makes cuBLAS's handle and workspace: before the ready line too
    info["reserved_bytes"] = int(torch.cuda.memory_reserved(0))
    halt = _keep_busy(product)

    def release() -> None:
        halt()
        block.data_ptr()  # referenced until here, so that the allocation is held until the busy thread stopped

    return info, release


def _hold_driver(nbytes: int, _fake_uuid: str | None, busy: bool) -> tuple[dict[str, Any], Callable[[], None]]:
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
    if not busy:
        return info, lambda: cuda.cuMemFree_v2(pointer)

    # No kernel of its own without a toolkit: memsets over the allocation, which the driver runs as kernels.
    def memset() -> None:
        cuda.cuMemsetD8_v2(pointer, 1, nbytes)
        cuda.cuCtxSynchronize()

    halt = _keep_busy(memset, setup=lambda: cuda.cuCtxSetCurrent(context))

    def release() -> None:
        halt()
        cuda.cuMemFree_v2(pointer)

    return info, release


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


@dataclass(frozen=True)
class HolderSpec:
    """One holder child to start: its backend (``fake`` in a dry run), what it allocates and does, its environment
    beyond the smoke's own, and the label its stderr file is named after."""

    backend: str
    nbytes: int
    work: str = "idle"
    env: Mapping[str, str] | None = None
    label: str = ""
    fake_uuid: str | None = None


def start_holders(
    specs: Sequence[HolderSpec], deadline: Deadline, workdir: Path, on_stop: Callable[[int], None] = lambda pid: None
) -> list[Holder]:
    """Start the holder children together (a PyTorch import takes seconds) and wait for each one's ready line.

    ``HolderFailed`` with the first reason when one cannot hold; every child started is stopped then.
    ``on_stop(pid)`` runs after each child is stopped (the dry run's fake NVML stops listing it).
    """
    started: list[tuple[Holder, int, Path, str]] = []
    try:
        for spec in specs:
            read_fd, write_fd = os.pipe()
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--hold",
                spec.backend,
                "--alloc-bytes",
                str(spec.nbytes),
                "--ready-fd",
                str(write_fd),
                "--work",
                spec.work,
            ]
            if spec.fake_uuid:
                command += ["--fake-uuid", spec.fake_uuid]
            label = spec.label or spec.backend
            stderr_path = workdir / f"holder-{label}.stderr"
            try:
                with open(stderr_path, "wb") as stderr:
                    process = subprocess.Popen(
                        command,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        stderr=stderr,
                        pass_fds=(write_fd,),
                        env={**os.environ, **(spec.env or {})},
                    )
            finally:
                os.close(write_fd)
            holder = Holder(process, {}, lambda pid=process.pid: on_stop(pid))
            started.append((holder, read_fd, stderr_path, label))
        for holder, read_fd, stderr_path, label in started:
            holder.info = _ready(read_fd, deadline, stderr_path, label)
    except BaseException:
        for holder, *_ in started:
            holder.stop()
        raise
    finally:
        for _, read_fd, *_ in started:
            with contextlib.suppress(OSError):
                os.close(read_fd)
    return [holder for holder, *_ in started]


def _ready(read_fd: int, deadline: Deadline, stderr_path: Path, label: str) -> dict[str, Any]:
    """The holder's ready message, or ``HolderFailed`` with why it is not ready."""
    line = _read_line(read_fd, deadline.left(150))
    if line is None:
        tail = stderr_path.read_text(errors="replace").strip().splitlines()
        raise HolderFailed(f"the {label} holder exited without saying it was ready" + (f": {tail[-1]}" if tail else ""))
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        raise HolderFailed(f"the {label} holder said {line!r}") from None
    if not message.get("ok"):
        raise HolderFailed(str(message.get("error")))
    return message


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


def run_command(
    command: Sequence[str], timeout: float, *, env: Mapping[str, str] | None = None, stdin: str | None = None
) -> dict[str, Any]:
    """A command's output for the record; never raises for the command's own failures."""
    try:
        done = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, check=False, env=env, input=stdin
        )
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


def _imported_from(module: str) -> str | None:
    """The folder ``module`` is imported from: the installed package's, never the checkout's (``outside_checkout``)."""
    spec = importlib.util.find_spec(module)
    return str(Path(spec.origin).parent) if spec is not None and spec.origin else None


def environment(nvidia_smi: str | None, deadline: Deadline) -> dict[str, Any]:
    record: dict[str, Any] = {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "kernel": platform.release(),
        "nvidia_ml_py": _version("nvidia-ml-py"),
        "gpu_fence": _version("gpu-fence"),
        "gpu_fence_from": _imported_from("gpu_fence.auditor"),
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


def none_listed(lib: str | None, pids: Iterable[int]) -> Callable[[], bool]:
    """For ``poll``: whether NVML lists none of ``pids`` (any more)."""
    wanted = set(pids)
    return lambda: not wanted & {process["pid"] for process in nvml_snapshot(lib)["processes"]}


def load_fake(name: str) -> ModuleType:
    """A module of the test suite's fakes (``tests/fakes/<name>``), from this checkout.

    ``tests`` and ``tests.fakes`` are bound to this checkout's folders first: a distribution that ships a top-level
    ``tests`` package (some do) would win the import otherwise, and the checkout itself is never put on
    ``sys.path``, where its ``gpu_fence/`` folder would hide the installed package.
    """
    fakes = REPO / "tests" / "fakes"
    bound = sys.modules.get("tests.fakes")
    if bound is None or str(fakes) not in list(getattr(bound, "__path__", ())):
        for foreign in [module for module in sys.modules if module == "tests" or module.startswith("tests.")]:
            del sys.modules[foreign]
        for package, folder in (("tests", REPO / "tests"), ("tests.fakes", fakes)):
            module = ModuleType(package)
            module.__path__ = [str(folder)]
            sys.modules[package] = module
    return importlib.import_module(f"tests.fakes.{name}")


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
    """The fake NVML's configuration, rewritten as CUDA processes and an MPS server start and stop (what a driver
    would show): every process on GPU 0, with NVML's context beside its allocation, and live utilisation samples
    for the busy ones."""

    def __init__(self, workdir: Path, fault: str | None) -> None:
        self.path = workdir / "fake-nvml.conf"
        self.fault = fault
        self.processes: dict[int, tuple[int, int, bool]] = {}  # pid → bytes NVML reports, SM percent, MPS client
        self.mps_server: int | None = None
        os.environ[load_fake("nvml").CONFIG_ENV] = str(self.path)  # the in-process Nvml and every child read it

    @staticmethod
    def gpu_uuid(index: int) -> str:
        return load_fake("nvml").fake_gpu_uuid(index)

    def start(self, pid: int, allocated: int, *, sm: int = 0, mps: bool = False, fault: str | None = None) -> None:
        """A CUDA process that allocated ``allocated`` bytes, busy ``sm`` percent of the time, an MPS client or not;
        ``fault`` makes the fake misreport it (``--dry-run-fault``)."""
        if fault == "unlisted":
            return
        used = allocated // 2 if fault == "short-memory" else allocated + FAKE_CONTEXT_BYTES
        self.processes[pid] = (used, sm, mps)
        self.write()

    def serve_mps(self, pid: int | None) -> None:
        """The MPS server of GPU 0 is ``pid`` (None: no server)."""
        self.mps_server = pid
        self.write()

    def stop(self, pid: int) -> None:
        self.processes.pop(pid, None)
        if pid == self.mps_server:
            self.mps_server = None
        self.write()

    def write(self) -> None:
        fakes = load_fake("nvml")
        # pid 1 exists on every Linux host and runs in no pod: a GPU process that was there before the smoke.
        processes = [
            fakes.FakeProcess(
                device=self.gpu_uuid(FAKE_GPU_COUNT - 1), pid=1, used_memory_bytes=FAKE_OTHER_PROCESS_BYTES
            ),
            *(
                fakes.FakeProcess(self.gpu_uuid(0), pid, used_memory_bytes=used, kind="mps" if mps else "compute")
                for pid, (used, _, mps) in self.processes.items()
            ),
        ]
        samples = tuple(
            fakes.FakeUtilSample(self.gpu_uuid(0), pid, sm=sm) for pid, (_, sm, _) in self.processes.items() if sm
        )
        servers = (
            ()
            if self.mps_server is None
            else (fakes.FakeMpsServer(self.gpu_uuid(0), self.mps_server, FAKE_MPS_SERVER_BYTES),)
        )
        gpus = tuple(
            fakes.FakeGpu(index=i, name=FAKE_GPU_NAME, memory_total_bytes=141 * GIB) for i in range(FAKE_GPU_COUNT)
        )
        partial = self.path.with_name(self.path.name + ".tmp")
        fakes.FakeNvmlConfig(gpus=gpus, processes=tuple(processes), samples=samples, mps_servers=servers).write(partial)
        partial.replace(self.path)


# --- the auditor ---------------------------------------------------------------------------------------------


def auditor_flags(
    socket_path: Path, lib: str | None, *, host_proc: str = "/proc", kubeconfig: Path | None = None
) -> list[str]:
    """``once``'s flags: the fake kubelet's socket, ``host_proc``, and the API fake's kubeconfig (else none)."""
    flags = ["--format", "json", "--pod-resources-socket", str(socket_path), "--host-proc", host_proc, "--node", NODE]
    flags += ["--kubeconfig", str(kubeconfig)] if kubeconfig is not None else ["--no-kubernetes"]
    return flags + (["--nvml-lib", lib] if lib else [])


def outside_checkout(paths: Iterable[str]) -> list[str]:
    """``paths`` (``sys.path`` or ``PYTHONPATH`` entries) without the checkout's root, whose ``gpu_fence/`` folder
    would hide the installed package's ``gpu_fence.auditor`` (the folders ``auditor/`` and ``webhook/`` install
    under ``gpu_fence``, and are only found there when installed)."""
    return [path for path in paths if path and Path(path).resolve() != REPO]


def child_environment() -> dict[str, str]:
    """The smoke's environment for the auditor it runs, without the checkout on ``PYTHONPATH``."""
    env = dict(os.environ)
    kept = outside_checkout(env.get("PYTHONPATH", "").split(os.pathsep))
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    env.setdefault("GRPC_VERBOSITY", "NONE")
    return env


def run_once(flags: Sequence[str], deadline: Deadline) -> dict[str, Any]:
    """One ``gpu-fence-auditor once`` (as ``python -P -m gpu_fence.auditor.cli``, the console script's own code, with
    nothing of the working directory on its path: the installed package, as the console script imports it), timed."""
    command = [sys.executable, "-P", "-m", "gpu_fence.auditor.cli", "once", *flags]
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=deadline.left(60),
            check=False,
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


# --- the tenants scenario --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tenant:
    """A pod of the tenants scenario: one container (``main``) running one CUDA process, in a cgroup named as the
    kubelet and its runtime name that container's (``layout``, a key of ``tests/fakes/hostproc_tree.py``'s
    ``LAYOUTS``), holding the time-slicing replica ``replica`` of the GPU (None: no allocation at all)."""

    pod: str
    layout: str
    replica: int | None
    work: str
    nbytes: int
    uid: str
    container_id: str

    @property
    def allocated(self) -> bool:
        return self.replica is not None


def plan_tenants(count: int, alloc_mib: int) -> list[Tenant]:
    """``count`` tenants of ``TENANTS``: the first ``count - 1``, and the last (unallocated, idle) always."""
    chosen = [*TENANTS[: count - 1], TENANTS[-1]]
    return [
        Tenant(
            pod, layout, replica, work, max(1, round(alloc_mib * share)) * MIB, str(uuid.uuid4()), secrets.token_hex(32)
        )
        for pod, layout, replica, work, share in chosen
    ]


class CgroupTree:
    """Places the tenants' processes in real cgroups: in every cgroup hierarchy ``hierarchies`` names (by default,
    where the smoke's own cgroup is in each hierarchy mounted here: ``own_cgroups``), a cgroup named as the kubelet
    and the runtime name the tenant's container, below a cgroup of the smoke's own (``gpu-smoke-<pid>``). So a real
    kubelet's cgroups are never touched, the tenants stay under whatever limits the smoke runs under, and one
    removal cleans up. Needs root (or a delegated cgroup) and a writable cgroup file system; ``/proc`` is the host's.
    """

    def __init__(self, hierarchies: Sequence[Path] | None = None) -> None:
        if hierarchies is None:
            hierarchies = own_cgroups(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
        self.hierarchies = list(hierarchies)
        self.top = f"gpu-smoke-{os.getpid()}"
        self.host_proc = "/proc"
        self.made: list[Path] = []  # the cgroups made, in the order they were made
        self.placed: dict[int, list[str]] = {}  # pid → the hierarchies it was placed in

    def describe(self) -> str:
        where = ", ".join(str(hierarchy / self.top) for hierarchy in self.hierarchies) or "no cgroup hierarchy"
        return f"real cgroups under {where}; /proc is the host's"

    def place(self, tenant: Tenant, pid: int, _environ: Mapping[str, str]) -> None:
        """Raises ``RoundFailed`` when no hierarchy takes the process."""
        path = load_fake("hostproc_tree").container_cgroup(tenant.uid, tenant.container_id, layout=tenant.layout)
        errors = []
        for hierarchy in self.hierarchies:
            target = hierarchy / self.top / path.lstrip("/")
            try:
                self._make(target)
                (target / "cgroup.procs").write_text(f"{pid}\n")
            except OSError as error:
                errors.append(f"{target}: {error.strerror or error}")
                continue
            self.placed.setdefault(pid, []).append(str(hierarchy))
        if pid not in self.placed:
            raise RoundFailed(
                f"cannot place pid {pid} in a cgroup ({'; '.join(errors) or 'no cgroup hierarchy is mounted'}); "
                "run as root on a host whose cgroup file system is writable"
            )

    def place_host(self, _pid: int) -> None:
        """A process outside any pod stays where it is."""

    def _make(self, target: Path) -> None:
        missing = []
        while not target.exists():
            missing.append(target)
            target = target.parent
        for directory in reversed(missing):
            directory.mkdir()
            self.made.append(directory)

    def close(self) -> list[str]:
        """Remove every cgroup made (their processes have exited); the ones that could not be removed, and why."""
        left = []
        for directory in reversed(self.made):
            try:
                directory.rmdir()
            except FileNotFoundError:
                continue
            except OSError as error:
                left.append(f"{directory}: {error.strerror or error}")
        self.made.clear()
        return left


def own_cgroups(mountinfo: str, membership: str) -> list[Path]:
    """Where a process's own cgroup is, in each cgroup hierarchy mounted: from the text of its ``/proc/<pid>/mountinfo``
    (each cgroup or cgroup2 mount: its mount point, the hierarchy path it shows, its controllers) and of its
    ``/proc/<pid>/cgroup`` (its path in each hierarchy: ``0::<path>`` on v2; a line per hierarchy on v1 and hybrid
    hosts). Left out: ``cpuset``, whose new cgroups take no process until their CPUs and memory nodes are set, and a
    hierarchy whose mount does not show the process's cgroup (a mount of another part of the tree)."""
    mounts: list[tuple[frozenset[str] | None, str, Path]] = []  # controllers (None: v2), the path shown, mount point
    for line in mountinfo.splitlines():
        head, separator, tail = line.partition(" - ")
        fields, kind = head.split(), tail.split()
        if not separator or len(fields) < 5 or len(kind) < 3 or kind[0] not in ("cgroup", "cgroup2"):
            continue
        controllers = None if kind[0] == "cgroup2" else frozenset(kind[2].split(","))
        mounts.append((controllers, _unescape(fields[3]), Path(_unescape(fields[4]))))
    found = set()
    for line in membership.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        wanted = frozenset(parts[1].split(",")) if parts[1] else None
        if wanted is not None and "cpuset" in wanted:
            continue
        for controllers, shown, mount_point in mounts:
            matches = controllers is None if wanted is None else controllers is not None and wanted <= controllers
            inside = parts[2] == shown or parts[2].startswith(shown.rstrip("/") + "/")
            if matches and inside:
                found.add(mount_point / parts[2][len(shown.rstrip("/")) :].lstrip("/"))
    return sorted(path for path in found if (path / "cgroup.procs").is_file())


def _unescape(field: str) -> str:
    """A mountinfo field as the kernel escapes it (space, tab, newline and backslash as ``\\ooo``)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


class FakeProc:
    """The dry run's placement: a host ``/proc`` tree of its own (``tests/fakes/hostproc_tree.py``), where each
    tenant's pid has the cgroup file a process in its container has on a ``hierarchy`` host (v2, v1 or hybrid), and
    its environment; the auditor reads that tree (``--host-proc``)."""

    def __init__(self, workdir: Path, hierarchy: str) -> None:
        self.tree = load_fake("hostproc_tree").HostProcTree(workdir / "proc")
        self.hierarchy = hierarchy
        self.host_proc = str(self.tree.root)

    def describe(self) -> str:
        return f"a fake /proc at {self.host_proc}, cgroup files as on a cgroup {self.hierarchy} host"

    def place(self, tenant: Tenant, pid: int, environ: Mapping[str, str]) -> None:
        text = load_fake("hostproc_tree").cgroup_text(
            tenant.uid,
            tenant.container_id,
            layout=tenant.layout,
            v1=self.hierarchy == "v1",
            hybrid=self.hierarchy == "hybrid",
        )
        self.tree.add_process(pid, cgroup=text, environ=environ)

    def place_host(self, pid: int) -> None:
        """The MPS server's stand-in: a host process, named as the real one."""
        directory = self.tree.add_process(pid, cgroup="0::/system.slice/nvidia-mps.service\n", environ={})
        (directory / "comm").write_text("nvidia-cuda-mps-server\n")

    def close(self) -> list[str]:
        return []


class RoundFailed(Exception):
    """A tenants round could not be set up here (cgroups, CUDA, the MPS daemon): one check says why."""

    def __init__(self, reason: str, *, status: str = FAIL) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class RoundFacts:
    """Everything the checks of one tenants round judge (plain values, so ``evaluate_round`` is pure)."""

    mode: str  # time-slicing | mps
    gpu: str
    tenants: tuple[Tenant, ...]
    pids: Mapping[str, int]  # pod → its CUDA process's pid
    cycles: tuple[Mapping[str, Any], ...]  # each in-process cycle: its JSON report, NVML's bytes per pid, metrics
    once: Mapping[str, Any]  # the `once` run: exit_code, report
    gone: bool  # NVML stopped listing the tenants after they exited
    cgroups_left: tuple[str, ...]
    mps: Mapping[str, Any] | None = None  # the MPS daemon's start and stop, NVML's lists and samples under MPS


def evaluate_round(facts: RoundFacts) -> list[Check]:
    """The verdicts of one round, named ``tenants-*`` (time-slicing) or ``mps-*``."""
    prefix = "mps" if facts.mode == "mps" else "tenants"
    checks = [
        _named(prefix, facts),
        _memory(prefix, facts),
        _unallocated(prefix, facts),
        _allocated(prefix, facts),
    ]
    if facts.mode == "mps":
        checks += _mps_checks(facts)
    else:
        checks.append(_time_sliced_activity(facts))
    left = list(facts.cgroups_left)
    if not facts.gone:
        left.append("NVML still lists a tenant after it exited")
    if facts.mps is not None and (facts.mps.get("stop") or {}).get("exit_code") not in (0, None):
        left.append(f"`quit` to the MPS control daemon exited {facts.mps['stop'].get('exit_code')}")
    if facts.mps is not None and facts.mps.get("servers_gone") is False:
        left.append("NVML still lists the MPS server after the daemon was told to quit")
    checks.append(
        Check(f"{prefix}-cleanup", FAIL if left else PASS, "; ".join(left) or "tenants stopped, cgroups removed")
    )
    return checks


def _rows(cycle: Mapping[str, Any], namespace: str) -> dict[str, Mapping[str, Any]]:
    return {
        row["pod"]: row
        for row in cycle["report"]["containers"]
        if row["namespace"] == namespace and row["container"] == TENANT_CONTAINER
    }


def _namespace(facts: RoundFacts) -> str:
    return f"smoke-{facts.mode}"  # the namespace of the round's pods


def _nvml_bytes(cycle: Mapping[str, Any], pid: int, gpu: str) -> int | None:
    return next((size for listed, device, size in cycle["nvml"] if listed == pid and device == gpu), None)


def _named(prefix: str, facts: RoundFacts) -> Check:
    problems = []
    rows = _rows(facts.cycles[-1], _namespace(facts)) if facts.cycles else {}
    for tenant in facts.tenants:
        row = rows.get(tenant.pod)
        if row is None:
            problems.append(f"{tenant.pod} has no row")
        elif (row["identity"], row["pod_uid"], row["container_id"]) != ("kubernetes", tenant.uid, tenant.container_id):
            problems.append(
                f"{tenant.pod} is named by {row['identity']}, uid {row['pod_uid']}, id {row['container_id']}"
            )
        elif facts.gpu not in row["used"]:
            problems.append(f"{tenant.pod} does not use {facts.gpu}")
    layouts = ", ".join(f"{tenant.pod} {tenant.layout}" for tenant in facts.tenants)
    return Check(f"{prefix}-named", FAIL if problems else PASS, "; ".join(problems) or f"named by the API: {layouts}")


def _memory(prefix: str, facts: RoundFacts) -> Check:
    problems, last = [], []
    for number, cycle in enumerate(facts.cycles):
        rows = _rows(cycle, _namespace(facts))
        for tenant in facts.tenants:
            nvml = _nvml_bytes(cycle, facts.pids[tenant.pod], facts.gpu)
            reported = (rows.get(tenant.pod) or {}).get("memory_bytes", {}).get(facts.gpu)
            if nvml is None or reported != nvml:
                problems.append(f"cycle {number}: {tenant.pod} {reported} bytes, NVML {nvml}")
            elif number == len(facts.cycles) - 1:
                last.append(f"{tenant.pod} {reported}")
    if not facts.cycles:
        problems.append("no cycle was audited")
    detail = (
        "; ".join(problems[:4]) or f"equal to NVML's, to the byte, in {len(facts.cycles)} cycles: {', '.join(last)}"
    )
    return Check(f"{prefix}-memory", FAIL if problems else PASS, detail)


def _unallocated(prefix: str, facts: RoundFacts) -> Check:
    tenant = next(t for t in facts.tenants if not t.allocated)
    pid, problems = facts.pids[tenant.pod], []
    for number, cycle in enumerate(facts.cycles):
        found = [
            f
            for f in cycle["report"]["findings"]
            if f["kind"] == "used-unallocated" and f["pod"] == tenant.pod and f["gpu"] == facts.gpu
        ]
        nvml = _nvml_bytes(cycle, pid, facts.gpu)
        if not found or found[0]["memory_bytes"] != nvml:
            problems.append(f"cycle {number}: {[f['memory_bytes'] for f in found]} against NVML's {nvml}")
    once = facts.once.get("report") or {}
    if facts.once.get("exit_code") != 1 or not any(
        f["kind"] == "used-unallocated" and f["pod"] == tenant.pod for f in once.get("findings") or ()
    ):
        problems.append(f"`once` exited {facts.once.get('exit_code')} without the finding")
    kinds = sorted({f["kind"] for f in once.get("findings") or () if f.get("pod") == tenant.pod})
    detail = "; ".join(problems[:4]) or (
        f"used-unallocated for {tenant.pod} with NVML's bytes in every cycle and in `once` (exit 1); its findings: "
        f"{', '.join(kinds)}"
    )
    return Check(f"{prefix}-unallocated", FAIL if problems else PASS, detail)


def _allocated(prefix: str, facts: RoundFacts) -> Check:
    problems, others = [], set()
    for number, cycle in enumerate(facts.cycles):
        rows = _rows(cycle, _namespace(facts))
        for tenant in (t for t in facts.tenants if t.allocated):
            if (rows.get(tenant.pod) or {}).get("allocation_counts") != {facts.gpu: 1}:
                problems.append(
                    f"cycle {number}: {tenant.pod} holds {(rows.get(tenant.pod) or {}).get('allocation_counts')}"
                )
            for finding in cycle["report"]["findings"]:
                if finding["pod"] != tenant.pod:
                    continue
                if finding["kind"] == "used-unallocated":
                    problems.append(f"cycle {number}: {tenant.pod}: {finding['message']}")
                else:
                    others.add(f"{tenant.pod} {finding['kind']} {finding['gpu']}")
    # On a host with more GPUs than the tenants use, a process outside a container sees every /dev/nvidia*.
    seen = f"; also found (a host process sees every GPU): {', '.join(sorted(others))}" if others else ""
    detail = "; ".join(problems[:4]) or f"each allocated tenant holds its replica and uses nothing else{seen}"
    return Check(f"{prefix}-allocated", FAIL if problems else PASS, detail)


def _sm(cycle: Mapping[str, Any], namespace: str, pod: str, gpu: str) -> float | None:
    busy = ((_rows(cycle, namespace).get(pod) or {}).get("gpu_activity") or {}).get(gpu)
    return None if busy is None else busy["sm"]


def _time_sliced_activity(facts: RoundFacts) -> Check:
    """Time-slicing gives each context the GPU in turn: the tenants' shares add up to at most about 1; the busy ones'
    are above 0, the idle one's about 0. The first cycle is left out: it reads what the driver kept from before."""
    measured = facts.cycles[1:]
    namespace, problems = _namespace(facts), []
    shares = {t.pod: [_sm(cycle, namespace, t.pod, facts.gpu) for cycle in measured] for t in facts.tenants}
    sums = [sum(share or 0.0 for share in column) for column in zip(*shares.values(), strict=True)]
    for tenant in facts.tenants:
        known = [share for share in shares[tenant.pod] if share is not None]
        if len(known) < len(measured):
            problems.append(f"{tenant.pod} has no activity in {len(measured) - len(known)} cycles")
            continue
        median = statistics.median(known) if known else 0.0
        if (tenant.work == "busy") != (median > BUSY_MIN):
            problems.append(f"{tenant.pod} ({tenant.work}) at a median of {median:.2f}")
    if not measured:
        problems.append("no cycle after the first")
    if sums and max(sums) > TIME_SLICED_SUM_MAX:
        problems.append(f"the shares add up to {max(sums):.2f}, more than {TIME_SLICED_SUM_MAX}")
    ranges = ", ".join(
        f"{pod} {min(v or 0.0 for v in values):.2f}-{max(v or 0.0 for v in values):.2f}"
        for pod, values in shares.items()
        if values
    )
    detail = "; ".join(problems) or f"SM shares over {len(measured)} cycles: {ranges}; sums at most {max(sums):.2f}"
    return Check("tenants-activity", FAIL if problems else PASS, detail)


def _mps_checks(facts: RoundFacts) -> list[Check]:
    mps = facts.mps or {}
    checks = []
    start = mps.get("start") or {}
    checks.append(
        Check(
            "mps-daemon",
            PASS if start.get("exit_code") == 0 else FAIL,
            f"{' '.join(start.get('command') or ['?'])} exited {start.get('exit_code')}"
            + (f": {start.get('stderr', '').strip()}" if start.get("exit_code") else ""),
        )
    )
    lists, problems = mps.get("lists") or {}, []
    compute, clients = lists.get("compute") or {}, lists.get("mps") or {}
    for tenant in facts.tenants:
        pid = str(facts.pids[tenant.pod])
        if pid not in clients or clients.get(pid) != compute.get(pid):
            problems.append(f"{tenant.pod}: compute list {compute.get(pid)}, MPS list {clients.get(pid)}")
    servers = mps.get("servers") or []
    if not servers:
        problems.append("no process in the compute list that is no client (the MPS server)")
    shown = ", ".join(f"pid {server['pid']} ({server.get('name')}) {server['bytes']} bytes" for server in servers)
    checks.append(
        Check(
            "mps-lists",
            FAIL if problems else PASS,
            "; ".join(problems) or f"every tenant in both lists with the same bytes; the server: {shown}",
        )
    )
    problems = []
    namespace = _namespace(facts)
    for number, cycle in enumerate(facts.cycles):
        rows = _rows(cycle, namespace)
        for tenant in facts.tenants:
            row = rows.get(tenant.pod) or {}
            if (
                facts.gpu in (row.get("gpu_activity") or {})
                or (row.get("gpu_activity_unknown") or {}).get(facts.gpu) != "mps"
            ):
                problems.append(
                    f"cycle {number}: {tenant.pod}: {row.get('gpu_activity')}, {row.get('gpu_activity_unknown')}"
                )
        series = cycle["metrics"]
        sm = [s for s in series if s["name"] == SM_GAUGE and s["labels"].get("gpu_uuid") == facts.gpu]
        reasons = {
            s["labels"].get("reason")
            for s in series
            if s["name"] == UNKNOWN_GAUGE and s["labels"].get("gpu_uuid") == facts.gpu
        }
        if sm or reasons != {"mps"}:
            problems.append(
                f"cycle {number}: {len(sm)} SM series on the GPU, unknown reasons {sorted(map(str, reasons))}"
            )
    checks.append(
        Check(
            "mps-activity-unknown",
            FAIL if problems else PASS,
            "; ".join(problems[:4])
            or f'no activity figure for any tenant in {len(facts.cycles)} cycles; the GPU says reason="mps"',
        )
    )
    sampled = set(mps.get("sampled_pids") or [])
    server_pids = {server["pid"] for server in servers}
    where = ", ".join(map(str, sorted(sampled))) or "none"
    checks.append(
        Check(
            "mps-samples",
            PASS if sampled and sampled <= server_pids else INFO,
            f"utilisation samples during the round for pids {where}; the server: "
            f"{', '.join(map(str, sorted(server_pids))) or 'none'}",
        )
    )
    return checks


class TenantsRound:
    """One round of the tenants scenario: ``--tenants`` CUDA processes in kubelet-shaped cgroups, a fake kubelet
    holding replicas of the GPU for the allocated ones and an API fake naming their pods; time-slicing, or (``mps``)
    as the clients of an MPS control daemon the round starts and stops.

    ``gpu`` is the GPU the single process ran on (CUDA device 0): the tenants run there too, and the allocated ones
    are started with it in ``NVIDIA_VISIBLE_DEVICES`` (as the device plugin sets it), the other with ``all`` (as an
    image's ``ENV`` does): ``/proc/<pid>/environ`` is what a process started with.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        workdir: Path,
        deadline: Deadline,
        fake: FakeNode | None,
        *,
        backend: str,
        gpu: str,
        mps: bool,
    ) -> None:
        self.args = args
        self.lib: str | None = args.dry_run_fake_nvml or args.nvml_lib
        self.deadline = deadline
        self.fake = fake
        self.backend = backend
        self.gpu = gpu
        self.mode = "mps" if mps else "time-slicing"
        self.prefix = "mps" if mps else "tenants"
        self.dir = workdir / self.mode
        self.wait = 2.0 if fake is not None else 20.0  # for NVML to list a process, or to stop listing it

    def run(self, record: dict[str, Any]) -> list[Check]:
        """Its checks, or one ``<prefix>-setup`` check saying why it could not be set up. Everything it started is
        stopped (and checked stopped) before it returns."""
        entry: dict[str, Any] = record.setdefault("tenants", {}).setdefault(self.mode, {})
        if self.fake is None and os.geteuid() != 0:
            reason = "placing processes in cgroups needs root: run the smoke as root"
            return [Check(f"{self.prefix}-setup", SKIP, reason)]
        self.dir.mkdir()
        placement = FakeProc(self.dir, self.args.dry_run_cgroup) if self.fake is not None else CgroupTree()
        tenants = plan_tenants(self.args.tenants, self.args.alloc_mib)
        entry.update(placement=placement.describe(), gpu=self.gpu, tenants=[asdict(tenant) for tenant in tenants])
        progress(f"tenants ({self.mode}): {', '.join(t.pod for t in tenants)}; {entry['placement']}")
        try:
            with contextlib.ExitStack() as stack:
                stack.callback(lambda: entry.update(cgroups_left=placement.close()))
                mps_env = self._start_mps(placement, stack, entry) if self.mode == "mps" else {}
                pids = self._start_tenants(tenants, mps_env, placement, stack, entry)
                flags = self._serve(tenants, placement.host_proc, stack)
                entry.update(pids=pids, flags=flags)
                if self.mode == "mps":
                    entry["lists"] = nvml_lists(self.lib, self.gpu)
                    entry["servers"] = mps_servers(entry["lists"], pids.values(), placement.host_proc)
                started = time.time()
                interval = CYCLE_INTERVAL_S if self.fake is None else DRY_CYCLE_INTERVAL_S
                entry["cycles"] = audit_cycles(flags, self.args.runs, interval, self.deadline)
                once = run_once(flags, self.deadline)
                entry["once"] = {key: once[key] for key in ("command", "exit_code", "seconds", "report", "stderr")}
                if self.mode == "mps":
                    entry["sampled_pids"] = sampled_pids(self.lib, self.gpu, since=started)
        except RoundFailed as failure:
            entry["failed"] = failure.reason
            return [Check(f"{self.prefix}-setup", failure.status, failure.reason)]
        except HolderFailed as error:
            entry["failed"] = str(error)
            return [Check(f"{self.prefix}-setup", FAIL, f"a tenant could not start: {error}")]
        mps_keys = ("start", "stop", "lists", "servers", "servers_gone", "sampled_pids")
        facts = RoundFacts(
            mode=self.mode,
            gpu=self.gpu,
            tenants=tuple(tenants),
            pids=pids,
            cycles=tuple(entry["cycles"]),
            once=entry["once"],
            gone=bool(entry.get("gone")),
            cgroups_left=tuple(entry.get("cgroups_left") or ()),
            mps={key: entry.get(key) for key in mps_keys} if self.mode == "mps" else None,
        )
        return evaluate_round(facts)

    def _start_tenants(
        self,
        tenants: Sequence[Tenant],
        mps_env: Mapping[str, str],
        placement: CgroupTree | FakeProc,
        stack: contextlib.ExitStack,
        entry: dict[str, Any],
    ) -> dict[str, int]:
        """The tenants' CUDA processes, started together and placed in their cgroups, once NVML lists them all on
        the GPU: pod → pid. Stopped when ``stack`` closes, then waited for until NVML no longer lists them
        (``entry["gone"]``)."""
        environs = {
            tenant.pod: {
                **mps_env,
                "HOSTNAME": tenant.pod,
                "NVIDIA_VISIBLE_DEVICES": self.gpu if tenant.allocated else "all",
            }
            for tenant in tenants
        }
        fake = self.fake
        specs = [
            HolderSpec(
                self.backend,
                tenant.nbytes,
                work=tenant.work,
                env=environs[tenant.pod],
                label=f"{self.mode}-{tenant.pod}",
                fake_uuid=fake.gpu_uuid(0) if fake is not None else None,
            )
            for tenant in tenants
        ]
        holders = start_holders(specs, self.deadline, self.dir, fake.stop if fake is not None else lambda pid: None)
        pids = {tenant.pod: holder.pid for tenant, holder in zip(tenants, holders, strict=True)}

        def gone() -> None:
            entry["gone"] = bool(poll(none_listed(self.lib, pids.values()), self.deadline, limit=self.wait))

        stack.callback(gone)
        for holder in holders:
            stack.callback(holder.stop)
        entry["cuda_processes"] = [holder.info for holder in holders]
        busy = [tenant.pod for tenant in tenants if tenant.work == "busy"]
        for tenant, holder in zip(tenants, holders, strict=True):
            placement.place(tenant, holder.pid, {"PATH": "/usr/bin:/bin", **environs[tenant.pod]})
            if fake is not None:
                sm = FAKE_BUSY_SM[busy.index(tenant.pod) % len(FAKE_BUSY_SM)] if tenant.pod in busy else 0
                fake.start(holder.pid, tenant.nbytes, sm=sm, mps=self.mode == "mps")
        self._wait_listed(pids)
        return pids

    def _wait_listed(self, pids: Mapping[str, int]) -> None:
        """Wait until NVML lists every tenant on the GPU; ``RoundFailed`` when it does not in time."""
        wanted = set(pids.values())
        seen: dict[int, str] = {}

        def listed() -> bool:
            found = nvml_snapshot(self.lib)["processes"]
            seen.clear()
            seen.update((p["pid"], p["device_uuid"]) for p in found if p["pid"] in wanted)
            return len(seen) == len(wanted)

        if not poll(listed, self.deadline, limit=self.wait):
            missing = sorted(pod for pod, pid in pids.items() if pid not in seen)
            raise RoundFailed(f"NVML does not list the CUDA processes of {', '.join(missing)}")
        elsewhere = sorted(f"{pod} on {seen[pid]}" for pod, pid in pids.items() if seen[pid] != self.gpu)
        if elsewhere:
            raise RoundFailed(f"the tenants must run on {self.gpu}, the single process's GPU: {', '.join(elsewhere)}")

    def _serve(self, tenants: Sequence[Tenant], host_proc: str, stack: contextlib.ExitStack) -> list[str]:
        """Start the fake kubelet (replicas ``<gpu>::<n>`` for the allocated tenants, nothing for the other) and the
        API fake (the tenants' pods on node ``smoke``), stopped when ``stack`` closes; the auditor's flags."""
        servers = load_fake("podresources_server")
        api_fakes = load_fake("kubeapi_pods_events")
        runtimes = load_fake("hostproc_tree").RUNTIMES
        namespace = f"smoke-{self.mode}"
        pods = [
            servers.pod(
                tenant.pod,
                namespace,
                servers.container(
                    TENANT_CONTAINER, {GPU_RESOURCE: [f"{self.gpu}::{tenant.replica}"]} if tenant.allocated else None
                ),
            )
            for tenant in tenants
        ]
        replicas = [f"{self.gpu}::{n}" for n in range(len(tenants))]
        socket_path = self.dir / "kubelet.sock"
        kubelet = servers.FakeKubelet(socket_path, pods, servers.offered(GPU_RESOURCE, replicas)).start()
        stack.callback(kubelet.stop)
        api = api_fakes.FakeKubeApi().start()
        stack.callback(api.stop)
        for tenant in tenants:
            api.add_pod(
                api_fakes.make_pod(
                    namespace,
                    tenant.pod,
                    tenant.uid,
                    NODE,
                    [(TENANT_CONTAINER, tenant.container_id)],
                    runtime=runtimes[tenant.layout],
                )
            )
        kubeconfig = api.write_kubeconfig(self.dir / "kubeconfig")
        return auditor_flags(socket_path, self.lib, host_proc=host_proc, kubeconfig=kubeconfig)

    def _start_mps(
        self, placement: CgroupTree | FakeProc, stack: contextlib.ExitStack, entry: dict[str, Any]
    ) -> dict[str, str]:
        """Start the MPS control daemon (``nvidia-cuda-mps-control -d``) with pipe and log folders of the round's
        own, told to ``quit`` when ``stack`` closes, after which NVML must stop listing its server
        (``entry["servers_gone"]``); the environment that makes a CUDA process its client. The dry run's fake NVML
        gets a stand-in server, and runs a control daemon only when ``--mps-control`` names one."""
        pipes, logs = self.dir / "mps-pipe", self.dir / "mps-log"
        pipes.mkdir()
        logs.mkdir()
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
        control = self.args.mps_control or (shutil.which("nvidia-cuda-mps-control") if self.fake is None else None)
        if control is None and self.fake is None:
            raise RoundFailed("no nvidia-cuda-mps-control on PATH (--mps-control P names one)")
        if control is None:
            entry["start"] = {"command": ["(dry run: no control daemon)"], "exit_code": 0}
        else:
            entry["start"] = run_command([control, "-d"], self.deadline.left(30), env={**os.environ, **env})
            if entry["start"].get("exit_code") != 0:
                raise RoundFailed(f"{control} -d did not start the MPS control daemon: {entry['start']}")

        def stop() -> None:
            servers = {server["pid"] for server in entry.get("servers") or ()}
            if control is not None:
                quit_command = run_command([control], self.deadline.left(30), env={**os.environ, **env}, stdin="quit\n")
                entry["stop"] = quit_command
            entry["servers_gone"] = bool(poll(none_listed(self.lib, servers), self.deadline, limit=self.wait))

        stack.callback(stop)
        if self.fake is not None:
            # A real server starts with its first client; the stand-in, a process that holds nothing, starts now.
            (server,) = start_holders(
                [HolderSpec("fake", 0, label="mps-server")], self.deadline, self.dir, self.fake.stop
            )
            stack.callback(server.stop)
            placement.place_host(server.pid)
            self.fake.serve_mps(server.pid)
        return env


def audit_cycles(flags: Sequence[str], count: int, interval: float, deadline: Deadline) -> list[dict[str, Any]]:
    """``count + 1`` cycles of one in-process auditor, ``interval`` seconds apart (as ``run --interval`` paces
    them): each one's JSON report, NVML's bytes per pid, and the activity and memory series it exports."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpu_fence.auditor.cli import build_parser
    from gpu_fence.auditor.collect import CollectError
    from gpu_fence.auditor.daemon import Auditor
    from gpu_fence.auditor.metrics import AuditorMetrics
    from gpu_fence.auditor.report import to_json
    from gpu_fence.auditor.settings import AuditSettings

    auditor = Auditor(AuditSettings.from_args(build_parser().parse_args(["once", *flags])))
    cycles: list[dict[str, Any]] = []
    try:
        auditor.preflight()
        for number in range(count + 1):
            if number:
                time.sleep(deadline.left(interval))
            snapshot, result = auditor.cycle()
            metrics = AuditorMetrics(NODE)
            metrics.observe(snapshot, result, 0.0)
            cycles.append(
                {
                    "report": to_json(snapshot, result),
                    "nvml": [(p.pid, p.gpu_uuid, p.used_memory_bytes) for p in snapshot.processes],
                    "metrics": [
                        {"name": sample.name, "labels": sample.labels, "value": sample.value}
                        for family in text_string_to_metric_families(metrics.exposition().decode())
                        for sample in family.samples
                        if sample.name in ROUND_SERIES
                    ],
                }
            )
    except CollectError as error:
        raise RoundFailed(f"the auditor could not audit ({error.source.value}): {error.reason}") from None
    finally:
        auditor.close()
    return cycles


def nvml_lists(lib: str | None, gpu: str) -> dict[str, dict[str, int | None]]:
    """NVML's compute and MPS process lists of ``gpu`` as pynvml returns them: pid (as text) → bytes."""
    import pynvml

    from gpu_fence.auditor.nvml import Nvml

    with Nvml(lib):
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu)
        return {
            "compute": {str(p.pid): p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)},
            "mps": {str(p.pid): p.usedGpuMemory for p in pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)},
        }


def mps_servers(lists: Mapping[str, Mapping[str, int | None]], tenants: Iterable[int], host_proc: str) -> list[dict]:
    """The processes of the compute list that are neither a tenant nor an MPS client: the MPS server (its name as
    ``/proc`` shows it, for the record only: the auditor never goes by a name)."""
    clients = set(lists["mps"]) | {str(pid) for pid in tenants}
    found = []
    for pid, size in lists["compute"].items():
        if pid in clients:
            continue
        try:
            name = (Path(host_proc) / pid / "comm").read_text().strip()
        except OSError:
            name = None
        found.append({"pid": int(pid), "bytes": size, "name": name})
    return found


def sampled_pids(lib: str | None, gpu: str, *, since: float) -> list[int]:
    """The pids ``nvmlDeviceGetProcessUtilization`` has samples for since ``since`` (unix seconds).

    The whole buffer is asked for (``lastSeenTimeStamp`` 0) and cut at ``since`` here: nvml.h says the timestamps are
    CPU microseconds, not which clock's, and where they are not the wall clock's every sample is kept.
    """
    import pynvml

    from gpu_fence.auditor.nvml import Nvml

    with Nvml(lib):
        handle = pynvml.nvmlDeviceGetHandleByUUID(gpu)
        try:
            samples = [
                (int(sample.pid), int(sample.timeStamp)) for sample in pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
            ]
        except pynvml.NVMLError:
            return []
    start = int(since * 1_000_000)
    wall_clock = any(stamp >= start for _, stamp in samples)
    return sorted({pid for pid, stamp in samples if stamp >= start or not wall_clock})


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
        if args.tenants:
            load_fake("kubeapi_pods_events")
            load_fake("hostproc_tree")
            # prometheus_client, whose series a round reads back; the client the auditor names the pods with
            for module in ("gpu_fence.auditor.metrics", "kubernetes"):
                importlib.import_module(module)
    except CannotRun:
        raise
    except Exception as error:  # ImportError, or protobuf's VersionError for stubs newer than its runtime
        raise CannotRun(
            f"cannot import the project ({type(error).__name__}: {error}); install it for this Python "
            f"({sys.executable}): pip install . in the checkout, or see docs/gpu-smoke.md"
        ) from None

    fake = FakeNode(workdir, args.dry_run_fault) if dry_run else None
    if fake is not None:
        fake.write()  # before anything reads NVML or runs nvidia-smi: both see the fake node
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
        fake.start(holder.pid, allocated, fault=args.dry_run_fault)

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
        gone = bool(poll(none_listed(lib, [own["pid"]]), deadline, limit=2.0 if dry_run else 20.0))
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
    checks = evaluate(facts)
    if not args.tenants:
        return checks
    gpu = (
        own["device_uuid"]
        if own
        else match_uuid(holder.info.get("device_uuid"), [d["uuid"] for d in snapshot["devices"]])
    )
    if gpu is None:
        return [
            *checks,
            Check("tenants-setup", FAIL, "no GPU known for the tenants: NVML did not list the single process"),
        ]
    backend = holder.info["backend"]
    for mps in (False, True) if args.mps else (False,):
        checks += TenantsRound(args, workdir, deadline, fake, backend=backend, gpu=gpu, mps=mps).run(record)
    return checks


def start_cuda(choice: str, nbytes: int, deadline: Deadline, workdir: Path, fake: FakeNode | None) -> Holder:
    if fake is not None:
        (holder,) = start_holders(
            [HolderSpec("fake", nbytes, label="cuda", fake_uuid=fake.gpu_uuid(0))], deadline, workdir, fake.stop
        )
        return holder
    errors = []
    for backend in ("torch", "driver") if choice == "auto" else (choice,):
        try:
            (holder,) = start_holders([HolderSpec(backend, nbytes)], deadline, workdir)
            return holder
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
    for mode, entry in (record.get("tenants") or {}).items():
        lines += ["", f"## Tenants, {mode}", "", f"- {entry.get('placement')}; GPU {entry.get('gpu')}"]
        if entry.get("failed"):
            lines.append(f"- could not be set up: {entry['failed']}")
        lines += tenant_table(f"smoke-{mode}", entry)
    problems = (record.get("nvml") or {}).get("problems") or []
    if problems:
        lines += ["", "## NVML problems", ""]
        lines += [f"- {p.get('device') or 'node'}: {p.get('reason')}: {p.get('message')}" for p in problems]
    lines += ["", "What this run does and does not prove: docs/gpu-smoke.md.", ""]
    return "\n".join(lines)


def tenant_table(namespace: str, entry: Mapping[str, Any]) -> list[str]:
    """A round's tenants as markdown rows: allocation, NVML's bytes and the auditor's, SM activity per cycle."""
    cycles, gpu, pids = entry.get("cycles") or [], entry.get("gpu"), entry.get("pids") or {}
    if not cycles:
        return []
    lines = [
        "",
        "| tenant | cgroup layout | allocated | work | NVML bytes | auditor bytes | SM activity per cycle |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for tenant in entry.get("tenants") or ():
        pod = tenant["pod"]
        row = _rows(cycles[-1], namespace).get(pod) or {}
        shares = []
        for cycle in cycles:
            known = _sm(cycle, namespace, pod, gpu)
            why = ((_rows(cycle, namespace).get(pod) or {}).get("gpu_activity_unknown") or {}).get(gpu)
            shares.append(f"{known:.2f}" if known is not None else f"unknown ({why})" if why else "-")
        allocated = f"replica {tenant['replica']}" if tenant["replica"] is not None else "no"
        lines.append(
            f"| {pod} | {tenant['layout']} | {allocated} | {tenant['work']} | "
            f"{_nvml_bytes(cycles[-1], pids.get(pod), gpu)} | {(row.get('memory_bytes') or {}).get(gpu)} | "
            f"{', '.join(shares)} |"
        )
    return lines


# --- command line --------------------------------------------------------------------------------------------

EPILOG = """\
examples:
  python scripts/gpu-smoke.py --out smoke-results
  python scripts/gpu-smoke.py --out smoke-results --mps
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
        default=300,
        metavar="N",
        help="time limit of the whole run; past it, everything is stopped and it exits 2 (default: 300)",
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
        "--tenants",
        type=int,
        choices=(0, 2, 3),
        default=3,
        help="CUDA processes of the tenants scenario, in kubelet-shaped cgroups (needs root); 0: no tenants scenario "
        "(default: 3)",
    )
    parser.add_argument(
        "--mps",
        action="store_true",
        help="also run the tenants as MPS clients of an MPS control daemon the smoke starts and stops",
    )
    parser.add_argument(
        "--mps-control",
        metavar="P",
        help="the nvidia-cuda-mps-control to start and stop (default: on PATH; a dry run uses none unless given)",
    )
    parser.add_argument(
        "--dry-run-cgroup",
        choices=HIERARCHIES,
        default="v2",
        help="with --dry-run-fake-nvml: the tenants' cgroup files as on a cgroup v2, v1 or hybrid host (default: v2)",
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
    parser.add_argument("--work", choices=WORK, default="idle", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.hold:
        return hold_main(args.hold, args.alloc_bytes, args.ready_fd, args.fake_uuid, args.work)
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
    sys.path[:] = outside_checkout(sys.path)  # the installed package, never the checkout's gpu_fence/ folder

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
