"""Host ``/proc`` adapter: which container each process is in, what GPU device nodes it sees, its environment, the
files of its root. Every read of host or container files the auditor makes goes through :class:`HostProc`.

The auditor runs with ``hostPID`` and reads the host's /proc (``--host-proc``, normally ``/proc``). Processes come
and go while it reads: a pid that vanishes, or turns unreadable because it is exiting, is skipped and never fails
the cycle. Every OS error is therefore an answer ("unknown"), not an exception.

A dense node has ~30,000 processes and a 250 ms cycle budget, so :meth:`HostProc.container_pids` keeps what it
learnt between calls and reads the cgroup file only of processes it has not seen before. A pid reused by a new
process is told apart by the inode of its ``/proc/<pid>`` directory, which ``getdents`` returns for free: the
kernel makes a new inode for every new process (and, harmlessly, sometimes for the same one, which costs a re-read).

A process found outside any pod is read again during the ``recheck_scans`` scans after the one that first saw it,
and never after: it may have been caught in ``runc init``, the few milliseconds before the runtime moves a
container's first process into its cgroup. Re-reading every host process forever would cost most of a warm cycle.
The processes of the auditor's first scan are of unknown age, nearly all long-lived: their windows start spread
by pid over the next ``startup_spread`` scans, so that no one cycle after a start re-reads the whole node.

What is kept per process is one dict entry (pid → inode), not an object, and it is updated in place: the state of
a 30,000-process node must fit the auditor's memory budget. The cgroup texts of a container's processes are equal,
so their parsed identity is one object, looked up by the file's bytes rather than parsed again.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from .cgroups import CgroupIdentity, parse_cgroup

#: Character major of NVIDIA's GPU device nodes (``/dev/nvidia<minor>``, ``/dev/nvidiactl``, ``/dev/nvidia-modeset``).
NVIDIA_MAJOR = 195
#: Minors on major 195 that are not GPUs: ``nvidia-modeset`` (254) and ``nvidiactl`` (255).
NON_GPU_MINORS = frozenset({254, 255})
#: Distinct cgroup texts remembered with their parsed identity (about one per container and one per host service);
#: past this the memo starts afresh, so a node with more never grows it without bound.
PARSED_LIMIT = 8192
#: The most read of one file in a process's root (a service-account namespace file is a few bytes).
ROOT_FILE_LIMIT = 4096
#: ``environ`` is read in pieces of this size: one read for nearly every process, the whole file for any.
ENVIRON_CHUNK = 65536
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_CHUNK = 4096


def read_small_file(path: str, chunk_size: int = _CHUNK) -> bytes | None:
    """The whole content of a small file with plain system calls (no file object, no text decoding), or None when
    it cannot be read: vanished (ENOENT), exiting (ESRCH), not ours to read (EACCES), not a file (EISDIR)."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        data = os.read(fd, chunk_size)
        if len(data) == chunk_size:  # a longer file: /proc serves it in pieces
            chunks = [data]
            while chunk := os.read(fd, chunk_size):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


class HostProc:
    """Reads the proc tree at ``root``: the host's (``--host-proc``) or a test's. Not thread-safe: one auditor cycle
    at a time uses it.

    The contract, stated per read as dcgm-exporter's ``ProcFS`` states its own (``ReadEnviron``: an absent key is
    an empty string and no error, an environ that is missing or unreadable an error; NVIDIA/dcgm-exporter
    ``internal/pkg/transformation/procfs.go``), with None for unknown where that returns an error:

    - Reading one process never raises. A file that cannot be read (the process exited or is exiting, it is not
      ours to read, a directory stands where a file should) is ``None``: unknown, never empty.
    - :meth:`environ` is ``None`` when the process's ``environ`` is unreadable, and a mapping without the name when
      the variable is unset; :meth:`identity` is ``None`` for a process in no pod and for one whose ``cgroup`` is
      unreadable, and :meth:`exists` tells the two apart.
    - Only listing the root raises (``OSError``, from :meth:`pids` and :meth:`container_pids`): a proc root that
      cannot be listed is a configuration error, unlike one process going away.

    ``recheck_scans``: how many scans re-read a process found outside any pod (0: none); ``startup_spread``: over
    how many scans the windows of the processes found by the first scan start. See the module docstring.
    """

    def __init__(self, root: str = "/proc", *, recheck_scans: int = 2, startup_spread: int = 8) -> None:
        if recheck_scans < 0:
            raise ValueError(f"recheck_scans must be 0 or more, got {recheck_scans}")
        if startup_spread < 1:
            raise ValueError(f"startup_spread must be at least 1, got {startup_spread}")
        self.root = root
        self.recheck_scans = recheck_scans
        self.startup_spread = startup_spread
        #: cgroup files read so far; shows (in tests and metrics) that scans are incremental.
        self.cgroup_reads = 0
        self._inodes: dict[int, int] = {}  # every pid of the last scan → its inode << 1 | that scan's parity
        self._identities: dict[int, CgroupIdentity] = {}  # the pids of the last scan that are in a pod
        self._recheck: dict[int, int] = {}  # pids outside any pod with re-checks to come → the last scan to re-read
        self._parsed: dict[bytes, CgroupIdentity | None] = {}
        self._scans = 0

    def _path(self, pid: int, name: str) -> str:
        return f"{self.root}/{pid}/{name}"

    def root_is_directory(self) -> bool:
        """Whether the root is a directory at all: a proc root that is not is a configuration error, not a cycle's."""
        return os.path.isdir(self.root)

    def exists(self, pid: int) -> bool:
        """Whether ``/proc/<pid>`` is there: a process, live or a zombie not yet reaped."""
        return os.path.exists(f"{self.root}/{pid}")

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

    def _parse(self, text: bytes) -> CgroupIdentity | None:
        try:
            return self._parsed[text]
        except KeyError:
            pass
        if len(self._parsed) >= PARSED_LIMIT:
            self._parsed.clear()
        identity = parse_cgroup(text.decode("utf-8", errors="replace"))
        self._parsed[text] = identity
        return identity

    def _read_cgroup(self, pid: int) -> bytes | None:
        self.cgroup_reads += 1
        return read_small_file(f"{self.root}/{pid}/cgroup")

    def identity(self, pid: int) -> CgroupIdentity | None:
        """The pod and container ``pid`` runs in, read now; None when it is in none or has vanished."""
        text = self._read_cgroup(pid)
        return self._parse(text) if text is not None else None

    def identities(self, pids: Iterable[int]) -> dict[int, CgroupIdentity]:
        """Identities of the given pids that are in a pod (others are left out).

        Uses what the latest :meth:`container_pids` scan learnt where it placed the pid in a container and the
        pid's ``/proc`` inode is still the one the scan saw (one ``stat``, cheaper than a read), and reads the
        rest: a GPU process that started since then, a pid reused since, or one the scan found outside any pod.
        """
        found: dict[int, CgroupIdentity] = {}
        for pid in pids:
            known = self._identities.get(pid)
            if known is not None:
                try:
                    same = os.stat(f"{self.root}/{pid}").st_ino == self._inodes[pid] >> 1
                except OSError:  # exited since the scan
                    continue
                identity = known if same else self.identity(pid)
            else:
                identity = self.identity(pid)
            if identity is not None:
                found[pid] = identity
        return found

    def window_end(self, pid: int, first_seen: int) -> int:
        """The last scan that re-reads ``pid``, found outside any pod by scan ``first_seen``; the window is the
        ``recheck_scans`` scans up to it. It follows the first sight, except after the auditor's first scan."""
        if self.recheck_scans == 0:
            return first_seen
        delay = pid % self.startup_spread if first_seen == 1 else 0
        return first_seen + delay + self.recheck_scans

    def container_pids(self) -> dict[str, int]:
        """container id → one live pid in it (the lowest), for every container with a process on the host.

        Incremental: lists the pids, reads the cgroup file only of pids new since the last call (or reused, or
        outside any pod and in their re-check window) and forgets vanished ones. Raises ``OSError`` as :meth:`pids`.

        The state is updated in place, never copied: each pid's entry holds its inode shifted left by one and, in the
        low bit, the parity of the last scan that listed it, so the pids this scan did not list are found at the end
        without a second table of every pid.
        """
        self._scans += 1
        scan, parity = self._scans, self._scans & 1
        inodes, identities, recheck = self._inodes, self._identities, self._recheck
        with os.scandir(self.root) as entries:
            for entry in entries:
                name = entry.name
                if not name.isdigit():
                    continue
                try:
                    mark = entry.inode() << 1 | parity
                except OSError:  # only where the platform needs a stat for it; the pid just went away
                    continue
                pid = int(name)
                before = inodes.get(pid)
                inodes[pid] = mark
                if before is not None and before ^ mark <= 1:  # the same inode: the same process
                    if pid in identities or pid not in recheck:
                        continue  # in a pod, or outside any pod and past its window
                    end = recheck[pid]
                    if scan <= end - self.recheck_scans:
                        continue  # its window has not started yet
                else:
                    end = self.window_end(pid, scan)
                text = self._read_cgroup(pid)
                if text is None:  # vanished between the listing and the read: forgotten, so a reused pid is read
                    self._forget(pid)
                    continue
                identity = self._parse(text)
                if identity is not None:
                    identities[pid] = identity
                    recheck.pop(pid, None)
                    continue
                identities.pop(pid, None)
                if scan < end:
                    recheck[pid] = end
                else:
                    recheck.pop(pid, None)
        for pid in [pid for pid, mark in inodes.items() if mark & 1 != parity]:
            self._forget(pid)
        if not recheck:
            self._recheck = {}  # a dict keeps its largest table: the one of the first scan's 30,000 host processes

        chosen: dict[str, int] = {}
        for pid, identity in identities.items():
            container = identity.container_id
            if container is not None and (container not in chosen or pid < chosen[container]):
                chosen[container] = pid
        return chosen

    def _forget(self, pid: int) -> None:
        del self._inodes[pid]
        self._identities.pop(pid, None)
        self._recheck.pop(pid, None)

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

    def environ(self, pid: int, *names: str) -> dict[str, str] | None:
        """The values of ``names`` in the process's initial environment: None when ``environ`` cannot be read, and
        a name left out when the process does not set it.

        The last occurrence of a name wins, as when the toolkit builds its map of the OCI spec's environment.
        """
        data = read_small_file(self._path(pid, "environ"), ENVIRON_CHUNK)
        if data is None:  # ENOENT, ESRCH, EACCES: the process is gone or not ours to read
            return None
        wanted = {name.encode() for name in names}
        found: dict[bytes, bytes] = {}
        for entry in data.split(b"\0"):
            key, separator, value = entry.partition(b"=")
            if separator and key in wanted:
                found[key] = value
        return {key.decode(): value.decode("utf-8", errors="replace") for key, value in found.items()}

    def read_root_file(self, pid: int, path: str) -> bytes | None:
        """The first ``ROOT_FILE_LIMIT`` bytes of the file at ``path`` (relative) in the process's root, or None when it
        cannot be read. The root is the container's own file system: what it holds, the container wrote."""
        try:
            fd = os.open(self._path(pid, f"root/{path}"), _READ_FLAGS)
        except OSError:
            return None
        try:
            return os.read(fd, ROOT_FILE_LIMIT)
        except OSError:
            return None
        finally:
            os.close(fd)
