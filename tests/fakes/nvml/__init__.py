"""The fake ``libnvidia-ml.so.1``: build it, configure it, and read its call counters.

``fake_nvml.c`` answers the NVML calls pynvml makes from a line-based file named by ``FAKE_NVML_CONFIG``
(format in ``docs/nvml.md``). Tests and the scenario builder describe a node with the dataclasses below and
``FakeNvmlConfig.write(path)``; nobody hand-writes the format. The library re-reads the file whenever the
init reference count goes from 0 to 1, so the same loaded library serves many configurations in a row.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
CONFIG_ENV = "FAKE_NVML_CONFIG"
GIB = 1 << 30

#: NVML return codes a test may inject (nvml.h ``nvmlReturn_t``).
NVML_RETURN_CODES: dict[str, int] = {
    "SUCCESS": 0,
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "LIB_RM_VERSION_MISMATCH": 18,
    "UNKNOWN": 999,
}

PROCESS_KINDS = ("compute", "graphics", "mps")


def build_fake_nvml(out_dir: Path | str) -> Path:
    """Compile ``fake_nvml.c`` into ``<out_dir>/<source hash>/libnvidia-ml.so.1`` and return its path.

    The directory is keyed by the hash of the source (and the compiler flags), so calling this from every test
    module costs one gcc run per session and a changed source never reuses a stale library. The library is
    written under a temporary name and renamed into place, so concurrent builders never load a half-written file.
    """
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", f"-Wl,-soname,{LIBRARY_NAME}", "-pthread"]
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    target = Path(out_dir) / digest / LIBRARY_NAME
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".build-", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run(["gcc", *flags, "-o", partial, str(SOURCE)], check=True, capture_output=True, text=True)
        os.replace(partial, target)
    except subprocess.CalledProcessError as error:
        raise RuntimeError(f"gcc could not build the fake NVML library:\n{error.stderr}") from error
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def fake_functions() -> tuple[str, ...]:
    """The NVML functions the fake implements (and so can inject errors into), read from its source."""
    text = SOURCE.read_text()
    table = text[text.index("function_names[] = {") : text.index("};", text.index("function_names[] = {"))]
    return tuple(re.findall(r'"(nvml\w+)"', table))


def fake_gpu_uuid(index: int) -> str:
    """A stable, well-formed GPU UUID for the fake GPU at ``index``."""
    return f"GPU-{index:08x}-0000-4000-8000-{index:012x}"


def fake_mig_uuid(gpu_index: int, slot: int) -> str:
    """A stable, well-formed MIG device UUID for ``slot`` on the fake GPU ``gpu_index``."""
    return f"MIG-{gpu_index:08x}-{slot:04x}-4000-8000-{gpu_index * 16 + slot:012x}"


def _token(value: str, what: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{what} must be one word without spaces, got {value!r}")
    return value


def _options(**given: object) -> str:
    """A config line's trailing ``key=value`` options; those given as None are left out (the C side's default)."""
    return "".join(f" {key}={value}" for key, value in given.items() if value is not None)


def _text(value: str, what: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError(f"{what} must be on one line, got {value!r}")
    return value


@dataclass(frozen=True)
class FakeGpu:
    """A physical GPU. ``index`` values of a config must be 0..n-1."""

    index: int
    uuid: str = ""  # default: fake_gpu_uuid(index)
    minor: int | None = None  # default: the index
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total_bytes: int = 80 * GIB
    mig: bool = False
    max_slices: int | None = None  # default: FakeNvmlConfig.max_slices

    def line(self) -> str:
        uuid = _token(self.uuid or fake_gpu_uuid(self.index), "GPU uuid")
        minor = self.index if self.minor is None else self.minor
        options = _options(mig=int(self.mig), max_slices=self.max_slices)
        return f"gpu {self.index} {uuid} {minor} {self.memory_total_bytes}{options} {_text(self.name, 'GPU name')}"


@dataclass(frozen=True)
class FakeMig:
    """A MIG device in ``slot`` of GPU ``gpu_index`` (which must have ``mig=True`` for NVML to list it)."""

    gpu_index: int
    slot: int
    gpu_instance_id: int
    compute_instance_id: int = 0
    slices: int = 1
    memory_total_bytes: int = 10 * GIB
    uuid: str = ""  # default: fake_mig_uuid(gpu_index, slot)
    name: str = ""  # default: "<parent name> MIG <slices>g.<GiB>gb", the form real NVML uses

    def resolved_uuid(self) -> str:
        return self.uuid or fake_mig_uuid(self.gpu_index, self.slot)

    def line(self, parent_name: str) -> str:
        name = self.name or f"{parent_name} MIG {self.slices}g.{round(self.memory_total_bytes / GIB)}gb"
        return (
            f"mig {self.gpu_index} {self.slot} {_token(self.resolved_uuid(), 'MIG uuid')} {self.gpu_instance_id} "
            f"{self.compute_instance_id} {self.slices} {self.memory_total_bytes} {_text(name, 'MIG name')}"
        )


@dataclass(frozen=True)
class FakeProcess:
    """A process on a GPU (``device`` = GPU index or UUID) or a MIG device (``device`` = its UUID).

    On a MIG device the process carries that device's GPU/compute instance ids; ``gpu_instance_id`` and
    ``compute_instance_id`` override them (for odd cases such as ids that match no MIG device).
    ``used_memory_bytes=None`` is NVML_VALUE_NOT_AVAILABLE.
    """

    device: int | str
    pid: int
    used_memory_bytes: int | None = GIB
    kind: str = "compute"
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    def line(self) -> str:
        if self.kind not in PROCESS_KINDS:
            raise ValueError(f"process kind must be one of {', '.join(PROCESS_KINDS)}, got {self.kind!r}")
        used = "na" if self.used_memory_bytes is None else str(self.used_memory_bytes)
        text = f"proc {_token(str(self.device), 'process device')} {self.kind} {self.pid} {used}"
        return text + _options(gi=self.gpu_instance_id, ci=self.compute_instance_id)


@dataclass(frozen=True)
class FakeMpsServer:
    """The MPS server (``nvidia-cuda-mps-server``) of ``device`` (a GPU index or UUID), as the real driver shows one
    (H200, driver 580.159.04): listed in the compute list with its own memory; the device's ``mps`` processes, its
    clients, listed in the compute list too, with the same memory; and every utilisation sample of a client reported
    under the server's pid (the samples of one instant added, at most 100%)."""

    device: int | str
    pid: int
    used_memory_bytes: int | None = 66 << 20

    def line(self) -> str:
        used = "na" if self.used_memory_bytes is None else str(self.used_memory_bytes)
        return f"mps_server {_token(str(self.device), 'MPS server device')} {self.pid} {used}"


@dataclass(frozen=True)
class FakeUtilSample:
    """One per-process utilisation sample NVML keeps for ``device`` (a GPU index or UUID): percentages as the
    driver reports them (``nvmlProcessUtilizationSample_t``; ``jpeg`` and ``ofa`` only in the versioned call).

    ``at`` is the sample's CPU timestamp in microseconds; None makes it *live*: stamped, at every query, with the
    latest multiple of ``FakeNvmlConfig.util_period_us`` (a driver that keeps sampling a busy process).
    """

    device: int | str
    pid: int
    sm: int = 0
    memory: int = 0
    encoder: int = 0
    decoder: int = 0
    jpeg: int = 0
    ofa: int = 0
    at: int | None = None

    def line(self) -> str:
        values = (self.pid, self.sm, self.memory, self.encoder, self.decoder)
        if any(value < 0 for value in (*values, self.jpeg, self.ofa)) or (self.at is not None and self.at <= 0):
            raise ValueError(f"utilisation sample values must be >= 0 and at= > 0, got {self!r}")
        text = f"util {_token(str(self.device), 'sample device')} " + " ".join(str(value) for value in values)
        return text + _options(jpg=self.jpeg or None, ofa=self.ofa or None, at=self.at)


@dataclass(frozen=True)
class FakeError:
    """Make ``function`` return ``code`` (a name from NVML_RETURN_CODES or a number).

    ``device`` limits it to one device (UUID, or a GPU index); ``times`` to the first n matching calls.
    """

    function: str
    code: str | int
    device: int | str | None = None
    times: int | None = None

    def line(self) -> str:
        code = self.code if isinstance(self.code, int) else NVML_RETURN_CODES[self.code]
        device = None if self.device is None else _token(str(self.device), "error device")
        return f"error {_token(self.function, 'function')} {code}" + _options(device=device, times=self.times)


@dataclass(frozen=True)
class FakeNvmlConfig:
    """A whole node as the fake NVML will report it."""

    gpus: tuple[FakeGpu, ...] = ()
    migs: tuple[FakeMig, ...] = ()
    processes: tuple[FakeProcess, ...] = ()
    errors: tuple[FakeError, ...] = ()
    driver_version: str = "550.163.01"
    max_slices: int = 7
    log_path: str | None = None  # the fake appends "<function> <return code>" per call
    samples: tuple[FakeUtilSample, ...] = ()
    util_period_us: int | None = None  # live samples' period (the fake's default: 100,000 µs)
    mps_servers: tuple[FakeMpsServer, ...] = ()

    def render(self) -> str:
        names = {gpu.index: gpu.name for gpu in self.gpus}
        lines = [f"driver {_token(self.driver_version, 'driver version')}", f"max_slices {self.max_slices}"]
        if self.log_path is not None:
            lines.append(f"log {_text(self.log_path, 'log path')}")
        if self.util_period_us is not None:
            lines.append(f"util_period {self.util_period_us}")
        lines += [gpu.line() for gpu in sorted(self.gpus, key=lambda gpu: gpu.index)]
        lines += [mig.line(names.get(mig.gpu_index, "NVIDIA GPU")) for mig in self.migs]
        lines += [server.line() for server in self.mps_servers]
        lines += [process.line() for process in self.processes]
        lines += [sample.line() for sample in self.samples]
        lines += [error.line() for error in self.errors]
        return "\n".join(lines) + "\n"

    def write(self, path: Path | str) -> Path:
        path = Path(path)
        path.write_text(self.render())
        return path

    def with_errors(self, *errors: FakeError) -> FakeNvmlConfig:
        return replace(self, errors=self.errors + errors)

    def running(self, *processes: FakeProcess) -> FakeNvmlConfig:
        """The same devices, running ``processes`` (instead of any this config had)."""
        return replace(self, processes=processes)

    def sampling(self, *samples: FakeUtilSample) -> FakeNvmlConfig:
        """The same node, with ``samples`` as the driver's utilisation buffer (instead of any this config had)."""
        return replace(self, samples=samples)


def mig_node(
    gpu_count: int,
    slices_per_gpu: int = 7,
    processes_per_slice: int = 0,
    *,
    first_pid: int = 10_000,
    name: str = "NVIDIA H100 80GB HBM3",
) -> FakeNvmlConfig:
    """A node of ``gpu_count`` MIG-mode GPUs, each cut into ``slices_per_gpu`` 1g slices, with compute processes.

    The benchmark's dense node is ``mig_node(8, 7, 36)`` (8 GPUs × 7 slices, 2,016 processes).
    """
    gpus = tuple(FakeGpu(index=i, name=name, mig=True) for i in range(gpu_count))
    migs = tuple(
        FakeMig(
            gpu_index=g, slot=s, gpu_instance_id=7 + s, compute_instance_id=0, slices=1, memory_total_bytes=10 * GIB
        )
        for g in range(gpu_count)
        for s in range(slices_per_gpu)
    )
    processes = []
    pid = first_pid
    for mig in migs:
        for n in range(processes_per_slice):
            processes.append(FakeProcess(device=mig.resolved_uuid(), pid=pid, used_memory_bytes=(n + 1) << 20))
            pid += 1
    return FakeNvmlConfig(gpus=gpus, migs=migs, processes=tuple(processes))


def environment(config_path: Path | str, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a subprocess that should load the fake with this configuration."""
    env = dict(os.environ if base is None else base)
    env[CONFIG_ENV] = str(config_path)
    return env


class FakeNvmlCounters:
    """The fake's call counters, read through the same loaded library the code under test uses.

    ``ctypes.CDLL`` of the same path returns the already-loaded object (dlopen reference counting), so these
    are the counts of the calls pynvml made.
    """

    def __init__(self, library: Path | str) -> None:
        self._lib = ctypes.CDLL(str(library))
        self._lib.fakeNvmlCallCount.argtypes = [ctypes.c_char_p]
        self._lib.fakeNvmlCallCount.restype = ctypes.c_uint
        self._lib.fakeNvmlResultCount.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self._lib.fakeNvmlResultCount.restype = ctypes.c_uint

    def calls(self, function: str) -> int:
        return int(self._lib.fakeNvmlCallCount(function.encode()))

    def results(self, function: str, code: str | int) -> int:
        number = code if isinstance(code, int) else NVML_RETURN_CODES[code]
        return int(self._lib.fakeNvmlResultCount(function.encode(), number))

    def reset(self) -> None:
        self._lib.fakeNvmlResetCounts()


class FakeNvmlClock:
    """The time the fake's live samples are stamped with, set by the test (``fakeNvmlSetClock``) through the same
    loaded library the code under test uses, as ``FakeNvmlCounters`` reads its counters. A new configuration load
    (the next init after every Nvml closed) goes back to the real clock."""

    def __init__(self, library: Path | str) -> None:
        self._lib = ctypes.CDLL(str(library))
        self._lib.fakeNvmlSetClock.argtypes = [ctypes.c_ulonglong]
        self._lib.fakeNvmlSetClock.restype = None

    def set(self, microseconds: int) -> None:
        """From now on the fake says it is ``microseconds`` (CPU time); 0 goes back to the real clock."""
        self._lib.fakeNvmlSetClock(microseconds)


def set_config(path: Path | str) -> None:
    """Point the fake at ``path`` for the next init in this process."""
    os.environ[CONFIG_ENV] = str(path)
