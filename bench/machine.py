"""What the benchmarks ran on, and the process-level measurements they share (CPU pinning, RSS).

Read from /proc at call time (never at import), so the figures in a result file always say where they came from.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def describe() -> dict[str, object]:
    """CPU model, logical CPUs, CPUs this process may use, Python and kernel versions."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": model,
        "nproc": os.cpu_count(),
        "cpus_allowed": sorted(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "kernel": platform.release(),
    }


def pin_to_one_core() -> int:
    """Restrict this process to one CPU (the last one it may use) and return that CPU's number.

    One core, as DESIGN's in-process target is stated per core; the last CPU because interrupts and most
    background work tend to land on CPU 0.
    """
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process now (``VmRSS``), in bytes; 0 when the process is gone."""
    return _status_kib(pid, "VmRSS:") * 1024


def peak_rss_bytes(pid: int | str = "self") -> int:
    """Peak resident set size of a process so far (``VmHWM``), in bytes; 0 when the process is gone."""
    return _status_kib(pid, "VmHWM:") * 1024


def _status_kib(pid: int | str, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def children_of(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (gunicorn's workers of its master), read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name may contain spaces and parentheses: the fields after the last ')' are fixed
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return sorted(found)


def established_connections(pid: int, port: int) -> int:
    """How many established TCP connections to local ``port`` the process holds (/proc/net/tcp{,6} and its fds):
    which gunicorn worker has which clients."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # 01: ESTABLISHED
                inodes.add(fields[9])
    held = 0
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return 0
    for descriptor in descriptors:
        try:
            target = os.readlink(descriptor)
        except OSError:
            continue
        held += target.startswith("socket:[") and target[8:-1] in inodes
    return held
