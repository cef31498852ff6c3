"""Host ``/proc`` adapter: which container each process is in, what GPU device nodes it sees, its environment.

The auditor runs with ``hostPID`` and reads the host's /proc (``--host-proc``, normally ``/proc``). Processes come
and go while it reads: a pid that vanishes, or turns unreadable because it is exiting, is skipped and never fails
the cycle. Every OS error is therefore an answer ("unknown"), not an exception.

A dense node has ~30,000 processes and a 250 ms cycle budget, so :meth:`HostProc.container_pids` keeps what it
learnt between calls and reads the cgroup file only of processes it has not seen before. A pid reused by a new
process is told apart by the inode of its ``/proc/<pid>`` directory, which ``getdents`` returns for free: the
kernel makes a new inode for every new process (and, harmlessly, sometimes for the same one, which costs a re-read).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from auditor.cgroups import CgroupIdentity, parse_cgroup

#: Character major of NVIDIA's GPU device nodes (``/dev/nvidia<minor>``, ``/dev/nvidiactl``, ``/dev/nvidia-modeset``).
NVIDIA_MAJOR = 195
#: Minors on major 195 that are not GPUs: ``nvidia-modeset`` (254) and ``nvidiactl`` (255).
NON_GPU_MINORS = frozenset({254, 255})


@dataclass(frozen=True)
class _Seen:
    inode: int
    identity: CgroupIdentity | None
    read_at: int  # the container_pids() call that read it


class HostProc:
    """Reads one host proc tree. Not thread-safe: one auditor cycle at a time uses it.

    ``recheck_every``: a process found outside any pod is read again every that many calls (spread over calls
    by pid), because a process can be caught during ``runc init`` before it joins its container's cgroup.
    """

    def __init__(self, root: str = "/proc", *, recheck_every: int = 8) -> None:
        if recheck_every < 1:
            raise ValueError(f"recheck_every must be at least 1, got {recheck_every}")
        self.root = root
        self.recheck_every = recheck_every
        #: cgroup files read so far; shows (in tests and metrics) that scans are incremental.
        self.cgroup_reads = 0
        self._seen: dict[int, _Seen] = {}
        self._scans = 0

    def _path(self, pid: int, name: str) -> str:
        return f"{self.root}/{pid}/{name}"

    def _listing(self) -> dict[int, int]:
        """pid → inode of ``/proc/<pid>``, from one directory read."""
        listing: dict[int, int] = {}
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.isdigit():
                    try:
                        listing[int(entry.name)] = entry.inode()
                    except OSError:  # only where the platform needs a stat for it; the pid just went away
                        continue
        return listing

    def pids(self) -> list[int]:
        """Every process id under the proc root, ascending.

        Raises ``OSError`` only when the proc root itself cannot be listed (not mounted, wrong ``--host-proc``):
        that is a configuration error, unlike a single process going away.
        """
        return sorted(self._listing())

    def _read_cgroup(self, pid: int) -> str | None:
        self.cgroup_reads += 1
        try:
            with open(self._path(pid, "cgroup"), encoding="utf-8", errors="replace") as file:
                return file.read()
        except OSError:  # vanished (ENOENT), exiting (ESRCH), not ours to read (EACCES), not a file
            return None

    def identity(self, pid: int) -> CgroupIdentity | None:
        """The pod and container ``pid`` runs in, read now; None when it is in none or has vanished."""
        text = self._read_cgroup(pid)
        return parse_cgroup(text) if text is not None else None

    def identities(self, pids: Iterable[int]) -> dict[int, CgroupIdentity]:
        """Identities of the given pids that are in a pod (others are left out).

        Uses what the latest :meth:`container_pids` scan learnt where it placed the pid in a container and the
        pid's ``/proc`` inode is still the one the scan saw (one ``stat``, cheaper than a read), and reads the
        rest: a GPU process that started since then, a pid reused since, or one the scan found outside any pod.
        """
        found: dict[int, CgroupIdentity] = {}
        for pid in pids:
            seen = self._seen.get(pid)
            if seen is not None and seen.identity is not None:
                try:
                    same = os.stat(f"{self.root}/{pid}").st_ino == seen.inode
                except OSError:  # exited since the scan
                    continue
                identity = seen.identity if same else self.identity(pid)
            else:
                identity = self.identity(pid)
            if identity is not None:
                found[pid] = identity
        return found

    def _due_for_recheck(self, pid: int) -> bool:
        return (self._scans + pid) % self.recheck_every == 0

    def container_pids(self) -> dict[str, int]:
        """container id → one live pid in it (the lowest), for every container with a process on the host.

        Incremental: lists the pids, reads the cgroup file only of pids new since the last call (or reused, or
        due for a recheck of a negative answer) and forgets vanished ones. Raises ``OSError`` as :meth:`pids`.
        """
        self._scans += 1
        current: dict[int, _Seen] = {}
        for pid, inode in self._listing().items():
            seen = self._seen.get(pid)
            fresh = seen is not None and seen.inode == inode
            if fresh and (seen.identity is not None or not self._due_for_recheck(pid)):
                current[pid] = seen
                continue
            text = self._read_cgroup(pid)
            if text is None:  # vanished between the listing and the read: not cached, so a reused pid is read
                continue
            current[pid] = _Seen(inode, parse_cgroup(text), self._scans)
        self._seen = current

        chosen: dict[str, int] = {}
        for pid, seen in current.items():
            container = seen.identity.container_id if seen.identity is not None else None
            if container is not None and (container not in chosen or pid < chosen[container]):
                chosen[container] = pid
        return chosen

    def visible_minors(self, pid: int) -> frozenset[int] | None:
        """Minors of the GPU device nodes in the process's ``/dev``; None when that cannot be read.

        Counts every character device directly in ``/dev`` with major 195 whatever its name (a node made under
        another name opens the same GPU) except ``nvidiactl`` and ``nvidia-modeset``; ``nvidia-uvm`` and
        ``nvidia-caps`` have other majors. Entries are never followed through symlinks: an absolute link in the
        container would resolve in the auditor's own mount namespace, not the container's.
        """
        minors: set[int] = set()
        try:
            with os.scandir(self._path(pid, "root/dev")) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if not stat.S_ISCHR(info.st_mode) or os.major(info.st_rdev) != NVIDIA_MAJOR:
                        continue
                    minor = os.minor(info.st_rdev)
                    if minor not in NON_GPU_MINORS:
                        minors.add(minor)
        except OSError:  # ENOENT, ESRCH, EACCES: the process is gone or not ours to read
            return None
        return frozenset(minors)

    def environ(self, pid: int, name: str) -> str | None:
        """The value of ``name`` in the process's initial environment, or None.

        The last occurrence wins, as when the toolkit builds its map of the OCI spec's environment.
        """
        try:
            with open(self._path(pid, "environ"), "rb") as file:
                data = file.read()
        except OSError:  # ENOENT, ESRCH, EACCES: the process is gone or not ours to read
            return None
        prefix = name.encode() + b"="
        value: bytes | None = None
        for entry in data.split(b"\0"):
            if entry.startswith(prefix):
                value = entry[len(prefix) :]
        return value.decode("utf-8", errors="replace") if value is not None else None
