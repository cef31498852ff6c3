"""NVML adapter: one snapshot of the node's GPUs, MIG devices and GPU processes, as our own frozen values.

Everything NVML-specific stays in this module: pynvml's process-global library handle, ``NVMLError`` codes,
the MIG handle walk and the ``0xFFFFFFFF`` instance ids. The rest of the auditor sees ``NvmlSnapshot`` (its devices
are the model's ``Gpu``) and, when nothing can be read at all, ``NvmlError`` with a short ``reason``. A GPU that
fails mid-read (lost, permission, an unsupported call) becomes an ``NvmlProblem`` in the snapshot, so one bad card
never hides the others.

Importing this module loads nothing: pynvml is imported and the library opened only by ``Nvml.open()``.
How NVML outcomes map to reasons and problems is documented in ``docs/nvml.md``.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeAlias

from .model import IDLE, Activity, ActivityUnknown, Gpu, NvmlReason

#: The ``pynvml`` module: it ships no type information, so what it holds and returns is ``Any``.
Pynvml: TypeAlias = Any

#: ``gpuInstanceId`` / ``computeInstanceId`` of a process when its GPU is not in MIG mode (nvml.h).
NO_INSTANCE = 0xFFFFFFFF

# nvml.h return codes (a stable ABI), so mapping them needs no pynvml import.
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_INSUFFICIENT_SIZE = 7
_INVALID_ARGUMENT = 2
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_ARGUMENT_VERSION_MISMATCH = 25

_REASON_BY_CODE = {
    _LIBRARY_NOT_FOUND: NvmlReason.LIBRARY_MISSING,
    _DRIVER_NOT_LOADED: NvmlReason.DRIVER_NOT_LOADED,
    _NO_PERMISSION: NvmlReason.NO_PERMISSION,
    _GPU_IS_LOST: NvmlReason.GPU_LOST,
    _NOT_SUPPORTED: NvmlReason.NOT_SUPPORTED,
    _FUNCTION_NOT_FOUND: NvmlReason.NOT_SUPPORTED,  # the driver's NVML predates the call
}

_ADVICE = {
    NvmlReason.LIBRARY_MISSING: (
        "point --nvml-lib at the host's libnvidia-ml.so.1 (with the GPU Operator's driver container it is under "
        "/run/nvidia/driver, e.g. /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1)"
    ),
    NvmlReason.DRIVER_NOT_LOADED: (
        "the NVIDIA kernel driver is not loaded on this node, or this container cannot see /dev/nvidiactl; "
        "check the driver and give the auditor every GPU (NVIDIA_VISIBLE_DEVICES=all, or privileged)"
    ),
    NvmlReason.NO_PERMISSION: "run the auditor privileged (or with access to /dev/nvidia*) so NVML can query every GPU",
    NvmlReason.GPU_LOST: "the GPU has fallen off the bus; drain the node and reset or replace the GPU",
}

# The three process lists NVML keeps per device, with the pynvml functions to try, newest struct version first.
_PROCESS_CALLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("compute", ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")),
    ("graphics", ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2")),
    ("mps", ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2")),
)
_SIZE_RETRIES = 3  # the list can outgrow pynvml's 2n+5 buffer between its two calls; NVML says: ask again
# Per-process utilisation, the versioned call first (NVML 12.4 on); the older one is in every driver since Maxwell.
_ACTIVITY_CALLS = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")
_PERCENT = 100  # nvml.h gives the values as "Util Value"; nvidia-smi pmon shows them as percent
# pynvml's structs route every attribute read through a Python __getattribute__ (it decodes bytes fields); the sample
# fields are integers, so they are read through ctypes' own, three times faster over a node's thousands of samples.
_STRUCT_FIELD = ctypes.Structure.__getattribute__


@dataclass(frozen=True)
class NvmlProcess:
    """A process with a context on a device: a GPU, or the MIG device it runs in when the GPU is in MIG mode."""

    pid: int
    device_uuid: str
    used_memory_bytes: int | None  # None: NVML_VALUE_NOT_AVAILABLE
    kind: str  # "compute" | "graphics" | "mps", or the lists it is in joined by "+" ("compute+graphics")
    activity: Activity | None = None  # since the previous snapshot; None where the device's activity is unknown


@dataclass(frozen=True)
class NvmlProblem:
    """Something this snapshot could not read; the rest of the snapshot is still true.

    ``message`` does not repeat ``device``: show them as ``<device>: <message>``.
    """

    device: str | None  # the GPU or MIG device UUID, when known (a GPU that failed before its UUID: None)
    reason: NvmlReason
    message: str


@dataclass(frozen=True)
class NvmlSnapshot:
    devices: tuple[Gpu, ...]  # every card, each followed by its MIG devices
    processes: tuple[NvmlProcess, ...]
    problems: tuple[NvmlProblem, ...]
    driver_version: str | None = None
    #: devices whose per-process utilisation NVML reported (their processes carry an ``activity``)
    activity_devices: frozenset[str] = frozenset()
    #: (device UUID, reason) of the devices whose process lists NVML could not read: their processes are unknown
    unlisted: tuple[tuple[str, NvmlReason], ...] = ()
    #: (device UUID, why) of every device not in ``activity_devices``: their processes' ``activity`` is None
    activity_unknown: tuple[tuple[str, ActivityUnknown], ...] = ()


class NvmlError(Exception):
    """NVML could not be used at all, and why (``reason``); the message says what to fix."""

    def __init__(self, reason: NvmlReason, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.code = code


def _pynvml() -> Pynvml:
    import pynvml  # noqa: PLC0415 - imported on open, so importing this module stays free

    return pynvml


def _code(error: BaseException | None) -> int | None:
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def _reason(code: int | None) -> NvmlReason:
    return _REASON_BY_CODE.get(code, NvmlReason.UNKNOWN) if code is not None else NvmlReason.UNKNOWN


def _with_advice(message: str, reason: NvmlReason) -> str:
    advice = _ADVICE.get(reason)
    return f"{message}; {advice}" if advice else message


# ---- which library pynvml talks to -------------------------------------------------------------------------
#
# pynvml keeps one library per process (the global ``pynvml.nvmlLib``, loaded by soname on first init) and caches
# every function pointer it resolves. To honour --nvml-lib we load that file ourselves and hand it to pynvml with
# the cache cleared, under pynvml's own lock. Two libraries cannot be open at the same time in one process, so
# switching is refused while another Nvml holds a different one; once all are closed, any path can be opened.


class _Binding:
    """The --nvml-lib pynvml is bound to (None: pynvml's own soname lookup) and how many Nvml have it open."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.path: str | None = None
        self.users = 0


_binding = _Binding()


def _load_library(lib_path: str) -> ctypes.CDLL:
    if os.path.isdir(lib_path):
        raise NvmlError(
            NvmlReason.LIBRARY_MISSING,
            f"--nvml-lib {lib_path} is a directory; give the library file in it, e.g. "
            f"{os.path.join(lib_path, 'libnvidia-ml.so.1')}",
        )
    try:
        return ctypes.CDLL(lib_path)
    except OSError as error:
        raise NvmlError(
            NvmlReason.LIBRARY_MISSING,
            _with_advice(f"cannot load the NVML library {lib_path}: {error}", NvmlReason.LIBRARY_MISSING),
            code=_LIBRARY_NOT_FOUND,
        ) from None


def _bind(pynvml: Pynvml, lib_path: str | None) -> None:
    with _binding.lock:
        if _binding.users and lib_path != _binding.path:
            raise NvmlError(
                NvmlReason.UNKNOWN,
                f"cannot open NVML library {lib_path or 'libnvidia-ml.so.1'} while "
                f"{_binding.path or 'libnvidia-ml.so.1'} is open in this process (pynvml holds one library per "
                "process); close the other Nvml first",
            )
        if not _binding.users and (lib_path != _binding.path or (lib_path is not None and pynvml.nvmlLib is None)):
            library = _load_library(lib_path) if lib_path is not None else None
            with pynvml.libLoadLock:
                pynvml.nvmlLib = library
                pynvml._nvmlGetFunctionPointer_cache.clear()
            _binding.path = lib_path
        _binding.users += 1


def _unbind() -> None:
    with _binding.lock:
        _binding.users = max(0, _binding.users - 1)


def _init_error(error: BaseException, lib_path: str | None) -> NvmlError:
    code = _code(error)
    library = lib_path or "libnvidia-ml.so.1"
    if code == _LIBRARY_NOT_FOUND:
        message = f"the NVML library {library} was not found on the library path"
        return NvmlError(NvmlReason.LIBRARY_MISSING, _with_advice(message, NvmlReason.LIBRARY_MISSING), code=code)
    if code == _FUNCTION_NOT_FOUND:
        message = f"{library} does not export nvmlInitWithFlags: it is not an NVML library, or one too old to use"
        return NvmlError(NvmlReason.LIBRARY_MISSING, _with_advice(message, NvmlReason.LIBRARY_MISSING), code=code)
    reason = _reason(code)
    return NvmlError(reason, _with_advice(f"NVML initialisation failed ({library}): {error}", reason), code=code)


# ---- reading one snapshot ----------------------------------------------------------------------------------


class _Failed(Exception):
    """An NVML call failed in a way that loses the device being read (or the GPU, for ``gpu-lost``)."""

    def __init__(self, action: str, error: BaseException) -> None:
        super().__init__(f"could not {action}: {error}")
        self.code = _code(error)
        self.reason = _reason(self.code)


@dataclass(frozen=True)
class _Mig:
    device: Gpu
    handle: Any


@dataclass
class _Kept:
    """What one open ``Nvml`` learns once and keeps across snapshots, by device UUID."""

    max_slices: dict[str, int] = field(default_factory=dict)  # slices of a MIG card (a property of the hardware)
    #: the newest utilisation sample read, so that the next snapshot asks NVML only for samples since then
    activity_since: dict[str, int] = field(default_factory=dict)
    #: the utilisation call that answered for the device (empty: neither does, such as on a MIG-enabled card)
    activity_calls: dict[str, tuple[str, ...]] = field(default_factory=dict)


class _Reader:
    """One snapshot's worth of NVML calls. Knows the order of the walk; the values go into the dataclasses."""

    def __init__(self, pynvml: Pynvml, kept: _Kept) -> None:
        self.nv = pynvml
        self.kept = kept
        self.devices: list[Gpu] = []
        self.problems: list[NvmlProblem] = []
        self.processes: dict[tuple[int, str], tuple[set[str], int | None]] = {}  # (pid, device) → kinds, bytes
        self.activity: dict[str, dict[int, Activity]] = {}  # device NVML sampled → pid → its activity
        self.unknown_activity: dict[str, ActivityUnknown] = {}  # every other device → why
        self.totals: dict[str, int | None] = {}  # device → memory, to tell a process's size from garbage
        self.unlisted: dict[str, NvmlReason] = {}  # device → why a process list of it could not be read

    def read(self) -> NvmlSnapshot:
        try:
            count = self.nv.nvmlDeviceGetCount()
        except self.nv.NVMLError as error:
            reason = _reason(_code(error))
            message = _with_advice(f"NVML cannot count the GPUs: {error}", reason)
            raise NvmlError(reason, message, code=_code(error)) from None
        for index in range(count):
            self._read_gpu(index)
        if count and not self.devices:
            first = self.problems[0].reason if self.problems else NvmlReason.UNKNOWN
            details = "; ".join(problem.message for problem in self.problems)
            raise NvmlError(first, f"none of the {count} GPUs could be read: {details}")
        order = {device.uuid: position for position, device in enumerate(self.devices)}
        processes = sorted(
            (
                NvmlProcess(pid, uuid, used, _kind(kinds), self._activity_of(pid, uuid))
                for (pid, uuid), (kinds, used) in self.processes.items()
            ),
            key=lambda process: (order.get(process.device_uuid, len(order)), process.pid),
        )
        return NvmlSnapshot(
            tuple(self.devices),
            tuple(processes),
            tuple(self.problems),
            self._driver_version(),
            frozenset(self.activity),
            tuple(self.unlisted.items()),
            tuple(self.unknown_activity.items()),
        )

    def _activity_of(self, pid: int, uuid: str) -> Activity | None:
        sampled = self.activity.get(uuid)
        return None if sampled is None else sampled.get(pid, IDLE)

    # -- calls ----------------------------------------------------------------------------------------------

    def _must(self, action: str, function: Callable[..., Any], *args: Any) -> Any:
        """A call the device cannot do without."""
        try:
            return function(*args)
        except self.nv.NVMLError as error:
            raise _Failed(action, error) from None

    def _may(
        self, device: str, action: str, function: Callable[..., Any], *args: Any, quiet: Collection[int] = ()
    ) -> Any:
        """A call the device can do without: None on failure, a problem unless the code is an expected one.

        A lost GPU still loses the whole GPU, whatever call noticed it.
        """
        try:
            return function(*args)
        except self.nv.NVMLError as error:
            code = _code(error)
            if code == _GPU_IS_LOST:
                raise _Failed(action, error) from None
            if code not in quiet:
                self._problem(device, _reason(code), f"could not {action}: {error}")
            return None

    def _problem(self, device: str | None, reason: NvmlReason, message: str) -> None:
        self.problems.append(NvmlProblem(device, reason, _with_advice(message, reason)))

    def _driver_version(self) -> str | None:
        try:
            return str(self.nv.nvmlSystemGetDriverVersion())
        except self.nv.NVMLError:
            return None

    # -- devices --------------------------------------------------------------------------------------------

    def _read_gpu(self, index: int) -> None:
        """Read GPU ``index`` with its MIG devices and processes, or record why not; all or nothing per GPU."""
        reader = _Reader(self.nv, self.kept)
        uuid: str | None = None
        try:
            handle = reader._must("get its handle", self.nv.nvmlDeviceGetHandleByIndex, index)
            uuid = str(reader._must("read its UUID", self.nv.nvmlDeviceGetUUID, handle))
            reader._read_gpu_device(index, handle, uuid)
        except _Failed as failure:
            self._problem(uuid, failure.reason, f"GPU {index} left out of this snapshot: {failure}")
            return
        self.devices += reader.devices
        self.problems += reader.problems
        self.activity.update(reader.activity)
        self.unknown_activity.update(reader.unknown_activity)
        self.unlisted.update(reader.unlisted)
        for (pid, uuid), (kinds, used) in reader.processes.items():
            for kind in kinds:
                self._add_process(pid, uuid, kind, used)

    def _read_gpu_device(self, index: int, handle: Any, uuid: str) -> None:
        nv = self.nv
        name = str(self._may(uuid, "read its name", nv.nvmlDeviceGetName, handle) or "")
        minor = self._may(uuid, "read its minor number", nv.nvmlDeviceGetMinorNumber, handle, quiet=[_NOT_SUPPORTED])
        memory = self._may(uuid, "read its memory", nv.nvmlDeviceGetMemoryInfo, handle)
        total = int(memory.total) if memory is not None else None
        mode = self._may(
            uuid, "read its MIG mode", nv.nvmlDeviceGetMigMode, handle, quiet=[_NOT_SUPPORTED, _FUNCTION_NOT_FOUND]
        )
        mig_enabled = bool(mode and mode[0])
        gpu = Gpu(uuid, index, minor, model=name, memory_total_bytes=total, mig_enabled=mig_enabled)
        self.devices.append(gpu)
        self.totals[uuid] = total
        if not mig_enabled:
            mps: bool | None = False  # MPS clients on the card; None: its MPS list could not be read
            for kind, functions in _PROCESS_CALLS:
                listed = self._list(uuid, handle, kind, functions)
                for process in listed or ():
                    self._add_process(int(process.pid), uuid, kind, process.usedGpuMemory)
                if kind == "mps":
                    mps = None if listed is None else bool(listed)
            # asked under MPS too, so that the next snapshot reads only samples newer than these
            self._judge_activity(uuid, self._read_activity(uuid, handle), mps)
            return
        # nvml.h: "On MIG-enabled GPUs, querying process utilization is not currently supported": not asked, so
        # the card and its MIG devices have no activity (unknown), never a zero.
        migs = self._read_migs(gpu, handle)
        self.devices += [mig.device for mig in migs]
        self.unknown_activity[uuid] = ActivityUnknown.MIG
        self.unknown_activity.update((mig.device.uuid, ActivityUnknown.MIG) for mig in migs)
        self._read_mig_processes(gpu, handle, migs)

    def _judge_activity(self, uuid: str, sampled: dict[int, Activity] | ActivityUnknown, mps: bool | None) -> None:
        """Keep what NVML sampled on a GPU as its processes' activity, or say why it is unknown.

        Under MPS the driver reports every client's work under the MPS server's pid (H200, driver 580.159.04): the
        clients have no samples of their own, and the server's are all of theirs. On a card with MPS clients no
        sample is any one process's own, so none is kept. MPS is known from NVML's MPS list alone, never from a
        process's name, which a container sets (docs/metrics.md, "Activity under MPS").
        """
        if isinstance(sampled, ActivityUnknown):
            self.unknown_activity[uuid] = sampled
        elif mps is None:
            self.unknown_activity[uuid] = ActivityUnknown.ERROR
        elif mps:
            self.unknown_activity[uuid] = ActivityUnknown.MPS
        else:
            self.activity[uuid] = sampled

    def _read_migs(self, gpu: Gpu, handle: Any) -> list[_Mig]:
        nv = self.nv
        slots = self._may(gpu.uuid, "count its MIG devices", nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        max_slices = self._max_slices(gpu.uuid, handle)
        migs = []
        for slot in range(int(slots)):
            mig_handle = self._may(
                gpu.uuid,
                f"get MIG device {slot}",
                nv.nvmlDeviceGetMigDeviceHandleByIndex,
                handle,
                slot,
                quiet=[_NOT_FOUND, _INVALID_ARGUMENT],  # an empty slot
            )
            if mig_handle is None:
                continue
            mig_uuid: str | None = None
            try:
                mig_uuid = str(self._must("read its UUID", nv.nvmlDeviceGetUUID, mig_handle))
                device = self._read_mig(gpu, slot, mig_uuid, mig_handle, max_slices)
            except _Failed as failure:
                if failure.code == _GPU_IS_LOST:
                    raise
                self._problem(
                    mig_uuid or gpu.uuid, failure.reason, f"MIG device {slot} left out of this snapshot: {failure}"
                )
                continue
            migs.append(_Mig(device, mig_handle))
            self.totals[device.uuid] = device.memory_total_bytes
        return migs

    def _read_mig(self, gpu: Gpu, slot: int, uuid: str, handle: Any, max_slices: int | None) -> Gpu:
        nv = self.nv
        gi = int(self._must("read its GPU instance id", nv.nvmlDeviceGetGpuInstanceId, handle))
        ci = int(self._must("read its compute instance id", nv.nvmlDeviceGetComputeInstanceId, handle))
        memory = self._may(uuid, "read its memory", nv.nvmlDeviceGetMemoryInfo, handle)
        total = int(memory.total) if memory is not None else None
        full_name = str(self._may(uuid, "read its name", nv.nvmlDeviceGetName, handle) or "")
        model, separator, profile = full_name.rpartition(" MIG ")
        attributes = self._may(
            uuid, "read its attributes", nv.nvmlDeviceGetAttributes, handle, quiet=[_NOT_SUPPORTED, _FUNCTION_NOT_FOUND]
        )
        slices = int(attributes.gpuInstanceSliceCount) if attributes is not None else 0
        share: float | None
        if slices and max_slices:
            share = min(1.0, slices / max_slices)
        elif total and gpu.memory_total_bytes:
            # No slice counts from this driver: the memory fraction is the nearest honest stand-in.
            share = min(1.0, total / gpu.memory_total_bytes)
        else:
            share = None
            self._problem(
                uuid, NvmlReason.NOT_SUPPORTED, "neither slice counts nor memory sizes are readable; share unknown"
            )
        return gpu.mig_device(
            uuid,
            mig_index=slot,
            gpu_instance_id=gi,
            compute_instance_id=ci,
            memory_total_bytes=total,
            profile=profile.strip() if separator else "",
            share=share,
            model=model if separator else None,
        )

    def _max_slices(self, uuid: str, handle: Any) -> int | None:
        """Slices of the whole card: the largest GPU-instance profile it offers (7 on A100/H100, 4 on A30).

        A property of the hardware, so it is asked once per card and kept for the life of the Nvml.
        """
        if uuid in self.kept.max_slices:
            return self.kept.max_slices[uuid]
        best = 0
        for profile in range(int(getattr(self.nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 8))):
            info = self._may(
                uuid,
                f"read GPU instance profile {profile}",
                self.nv.nvmlDeviceGetGpuInstanceProfileInfo,
                handle,
                profile,
                quiet=[_NOT_SUPPORTED, _INVALID_ARGUMENT, _NOT_FOUND, _FUNCTION_NOT_FOUND, _NO_PERMISSION],
            )
            if info is not None:
                best = max(best, int(info.sliceCount))
        if best:
            self.kept.max_slices[uuid] = best
        return best or None

    # -- processes ------------------------------------------------------------------------------------------

    def _list(
        self, device: str, handle: Any, kind: str, functions: Iterable[str], quiet: Iterable[int] = ()
    ) -> list[Any] | None:
        """One process list through pynvml (its size protocol), newest struct version the driver has; None when it
        could not be read (a problem, and the device is ``unlisted``).

        NOT_SUPPORTED means this device keeps no such list (graphics on a compute card, MPS before Volta):
        no processes, not a problem.
        """
        quiet = {_NOT_SUPPORTED, *quiet}
        last: BaseException | None = None
        for name in functions:
            function = getattr(self.nv, name, None)
            if function is None:
                continue
            for _ in range(_SIZE_RETRIES):
                try:
                    return list(function(handle))
                except self.nv.NVMLError as error:
                    last = error
                    if _code(error) != _INSUFFICIENT_SIZE:
                        break
            if _code(last) != _FUNCTION_NOT_FOUND:
                break
        if last is None:
            return []
        code = _code(last)
        if code == _GPU_IS_LOST:
            raise _Failed(f"list {kind} processes", last)
        if code in quiet:
            return []
        self._problem(device, _reason(code), f"could not list {kind} processes: {last}")
        self.unlisted.setdefault(device, _reason(code))
        return None

    def _read_activity(self, uuid: str, handle: Any) -> dict[int, Activity] | ActivityUnknown:
        """Each process's activity on the GPU since the previous snapshot (pid → activity; a process NVML has no
        sample for was idle), or why NVML cannot say (no such call or NOT_SUPPORTED; an error).

        The newest call the driver has, through pynvml's size protocol, asked only for samples newer than the newest
        one read before (``lastSeenTimeStamp``; 0 the first time: the driver's whole buffer). NOT_FOUND is NVML's
        "no sample since then": every process idle. The call that answered is kept per device, and so is "neither".
        """
        calls = self.kept.activity_calls.get(uuid, _ACTIVITY_CALLS)
        since = self.kept.activity_since.get(uuid, 0)
        for name in calls:
            function = getattr(self.nv, name, None)
            if function is None:
                continue
            for _ in range(_SIZE_RETRIES):  # samples can appear between pynvml's probe and its read
                try:
                    samples = function(handle, since)
                except self.nv.NVMLError as error:
                    code = _code(error)
                    if code == _INSUFFICIENT_SIZE:
                        continue
                    if code == _NOT_FOUND:
                        self.kept.activity_calls[uuid] = (name,)
                        return {}
                    if code in (_FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH):
                        break  # this driver lacks the call (or this version of its struct): the older call
                    if code == _GPU_IS_LOST:
                        raise _Failed("read per-process utilisation", error) from None
                    if code == _NOT_SUPPORTED:
                        self.kept.activity_calls[uuid] = ()
                        return ActivityUnknown.NOT_SUPPORTED
                    self._problem(uuid, _reason(code), f"could not read per-process utilisation: {error}")
                    return ActivityUnknown.ERROR
                self.kept.activity_calls[uuid] = (name,)
                return self._activity_by_pid(uuid, samples, since)
            else:
                self._problem(
                    uuid, NvmlReason.UNKNOWN, "could not read per-process utilisation: the sample count kept changing"
                )
                return ActivityUnknown.ERROR
        self.kept.activity_calls[uuid] = ()
        return ActivityUnknown.NOT_SUPPORTED

    def _activity_by_pid(self, uuid: str, samples: Iterable[Any], since: int) -> dict[int, Activity] | ActivityUnknown:
        """pid → the mean of its samples newer than ``since`` (nvml.h returns one per process; a driver that returns
        several is averaged), as shares of time. A value above 100% is garbage: the device's activity is unknown."""
        field = _STRUCT_FIELD
        sums: dict[int, list[int]] = {}
        newest = since
        garbage: tuple[int, tuple[int, ...]] | None = None
        for sample in samples:
            stamp = field(sample, "timeStamp")
            if stamp <= since:
                continue
            newest = max(newest, stamp)
            pid = field(sample, "pid")
            values = (
                field(sample, "smUtil"),
                field(sample, "memUtil"),
                field(sample, "encUtil"),
                field(sample, "decUtil"),
            )
            if max(values) > _PERCENT:
                garbage = (pid, values)
            total = sums.get(pid)
            if total is None:
                sums[pid] = [*values, 1]
            else:
                for position, value in enumerate(values):
                    total[position] += value
                total[4] += 1
        self.kept.activity_since[uuid] = newest  # past what was read, garbage too, so it is not read again
        if garbage is not None:
            bad_pid, bad_values = garbage
            self._problem(
                uuid,
                NvmlReason.UNKNOWN,
                f"process {bad_pid} reported a utilisation above 100% (SM, memory, encoder, decoder: "
                f"{', '.join(map(str, bad_values))}); the device's per-process activity is unknown this cycle",
            )
            return ActivityUnknown.ERROR
        return {
            pid: Activity(
                sm / count / _PERCENT, memory / count / _PERCENT, encoder / count / _PERCENT, decoder / count / _PERCENT
            )
            for pid, (sm, memory, encoder, decoder, count) in sums.items()
        }

    def _read_mig_processes(self, gpu: Gpu, handle: Any, migs: list[_Mig]) -> None:
        """Processes of a MIG-mode GPU, each attributed to the MIG device it runs in.

        Per-instance lists come from the MIG device handles (what nvml.h documents for unprivileged callers).
        The parent's list is the aggregate, with each process's GPU/compute instance ids, and only for a
        privileged caller: NO_PERMISSION there is expected. Both views are merged.
        """
        placed: set[int] = set()  # pids a MIG device handle already listed
        for mig in migs:
            for kind, functions in _PROCESS_CALLS:
                for process in self._list(mig.device.uuid, mig.handle, kind, functions) or ():
                    self._add_process(int(process.pid), mig.device.uuid, kind, process.usedGpuMemory)
                    placed.add(int(process.pid))
        by_ids = {(m.device.gpu_instance_id, m.device.compute_instance_id): m.device.uuid for m in migs}
        by_gi: dict[int | None, str | None] = {}
        for m in migs:
            gi = m.device.gpu_instance_id
            by_gi[gi] = None if gi in by_gi else m.device.uuid  # only a GPU instance with one MIG device is unambiguous
        for kind, functions in _PROCESS_CALLS:
            for process in self._list(gpu.uuid, handle, kind, functions, quiet=[_NO_PERMISSION]) or ():
                gi, ci = int(process.gpuInstanceId), int(process.computeInstanceId)
                target = by_ids.get((gi, ci)) or by_gi.get(gi)
                if target is None and int(process.pid) in placed:
                    continue  # the MIG device's own list placed it: the same memory, whatever ids the parent shows
                if target is None:
                    target = gpu.uuid
                    self._problem(
                        gpu.uuid,
                        NvmlReason.UNKNOWN,
                        f"{kind} process {process.pid} runs in MIG mode but in no known MIG device (GPU instance "
                        f"{_instance(gi)}, compute instance {_instance(ci)}); counted on the whole GPU",
                    )
                self._add_process(int(process.pid), target, kind, process.usedGpuMemory)

    def _add_process(self, pid: int, uuid: str, kind: str, used: int | None) -> None:
        """One entry per (pid, device). Seen twice (parent and MIG view; or in two lists, as nvidia-smi's C+G and
        M+C processes are), it is the same memory: usedGpuMemory is all the process holds on the device. Keep
        the larger reading rather than adding them."""
        used = None if used is None else int(used)
        total = self.totals.get(uuid)
        if used is not None and total and used > total:
            self._problem(
                uuid,
                NvmlReason.UNKNOWN,
                f"{kind} process {pid} reported {used} bytes, more than the device's "
                f"{total}; its memory is counted as unknown",
            )
            used = None
        key = (pid, uuid)
        kinds: set[str] = {kind}
        if key in self.processes:
            previous_kinds, previous = self.processes[key]
            kinds |= previous_kinds
            used = previous if used is None else used if previous is None else max(previous, used)
        self.processes[key] = (kinds, used)


def _kind(kinds: set[str]) -> str:
    """``compute``, ``graphics``, ``mps``, or several joined by ``+`` in that order (``compute+graphics``)."""
    return "+".join(kind for kind, _ in _PROCESS_CALLS if kind in kinds)


def _instance(value: int) -> str:
    return "none" if value == NO_INSTANCE else str(value)


class Nvml:
    """The node's NVML. ``open()`` once, ``snapshot()`` every cycle, ``close()`` at the end (or use ``with``).

    ``lib_path`` is ``--nvml-lib``; None lets pynvml find ``libnvidia-ml.so.1`` on the library path. One
    instance is not meant to be shared between threads.
    """

    def __init__(self, lib_path: str | None = None) -> None:
        self.lib_path = lib_path
        self._open = False
        self._kept = _Kept()

    def open(self) -> None:
        """Initialise NVML. Raises NvmlError (library-missing, driver-not-loaded, no-permission, ...)."""
        if self._open:
            return
        pynvml = _pynvml()
        _bind(pynvml, self.lib_path)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            _unbind()
            raise _init_error(error, self.lib_path) from None
        except BaseException:
            _unbind()
            raise
        self._kept = _Kept()
        self._open = True

    def close(self) -> None:
        """Shut NVML down (NVML counts inits, so other users in the process keep theirs). Safe to call twice."""
        if not self._open:
            return
        self._open = False
        pynvml = _pynvml()
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # nothing to do about a failed shutdown; the next open re-initialises
        finally:
            _unbind()

    def snapshot(self) -> NvmlSnapshot:
        """Devices and processes now. Per-device failures are problems in the snapshot; NvmlError only when no
        GPU at all could be read. No pynvml exception escapes."""
        if not self._open:
            raise NvmlError(NvmlReason.UNKNOWN, "NVML is not open: call Nvml.open() (or use `with Nvml(...)`) first")
        pynvml = _pynvml()
        try:
            return _Reader(pynvml, self._kept).read()
        except NvmlError:
            raise
        except pynvml.NVMLError as error:  # a safety net: every call above is meant to be caught where it is made
            reason = _reason(_code(error))
            raise NvmlError(reason, _with_advice(f"NVML failed: {error}", reason), code=_code(error)) from None
        except pynvml.NVMLLibraryMismatchError as error:
            raise NvmlError(
                NvmlReason.NOT_SUPPORTED, f"this driver's NVML lacks a call pynvml needs: {error}"
            ) from None

    def __enter__(self) -> Nvml:
        self.open()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
