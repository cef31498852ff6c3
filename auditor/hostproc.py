"""Host ``/proc`` adapter: which container each process is in, what GPU device nodes its processes see, their
environment, the files of a container's root. Every read of host or container files the auditor makes goes through
:class:`HostProc`.

The auditor runs with ``hostPID`` and reads the host's /proc (``--host-proc``, normally ``/proc``). Processes come
and go while it reads: a pid that vanishes, or turns unreadable because it is exiting, is skipped and never fails
the cycle. Every OS error is therefore an answer ("unknown"), not an exception.

**The scan.** A dense node has ~30,000 processes and a 250 ms cycle budget, so :meth:`HostProc.scan` keeps what it
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

**A container's processes** (:meth:`HostProc.inspect`) are judged all together, never by one of them: a process
that chroots into an empty tree, or unshares its mount namespace and covers ``/dev``, sees less than its siblings,
and whichever process the auditor picked would otherwise decide what the container "sees". Processes that share a
mount namespace and a root share one view, so each process costs one ``statx`` of its ``root`` (the mount id says
the namespace; where the kernel has none, a ``stat`` and a ``readlink`` of ``ns/mnt``) and each distinct view one
listing of its ``/dev``. ``NVIDIA_VISIBLE_DEVICES`` is read once per process,
when first seen: it is the environment the process started with, and what it writes over it later changes nothing
the toolkit did. The work per container and cycle is bounded (``PROCESS_LIMIT`` processes, ``VIEW_LIMIT`` views,
``DEV_ENTRY_LIMIT`` entries per ``/dev``, ``ENV_VALUE_LIMIT`` values); past a bound the container's sight says so
(``ViewLimit``) and the audit reports the container as not fully judged, so that a bound is never a place to hide.

**A container's root** is written by the container. Every path in it is resolved inside it (``auditor.inroot``:
openat2 ``RESOLVE_IN_ROOT`` where the kernel has it, else a component walk), never through a symlink out of it;
only regular files are read and only directories listed, non-blocking, and both bounded.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_fence.vocabulary import VISIBLE_DEVICES_ENV

from . import inroot
from .cgroups import CgroupIdentity, parse_cgroup
from .model import ViewLimit

#: Character major of NVIDIA's GPU device nodes (``/dev/nvidia<minor>``, ``/dev/nvidiactl``, ``/dev/nvidia-modeset``).
NVIDIA_MAJOR = 195
#: Minors on major 195 that are not GPUs: ``nvidia-modeset`` (254) and ``nvidiactl`` (255).
NON_GPU_MINORS = frozenset({254, 255})
#: Distinct cgroup texts remembered with their parsed identity (about one per container and one per host service);
#: past this the memo starts afresh, so a node with more never grows it without bound.
PARSED_LIMIT = 8192
#: The most read of one file in a container's root (a service-account namespace file is a few bytes).
ROOT_FILE_LIMIT = 4096
#: ``environ`` is read in pieces of this size: one read for nearly every process, the whole file for any.
ENVIRON_CHUNK = 65536
#: Processes of one container judged per cycle (the lowest pids); a container with more is reported.
PROCESS_LIMIT = 4096
#: Distinct views (mount namespace and root) of one container whose ``/dev`` is listed per cycle.
VIEW_LIMIT = 8
#: Entries of one ``/dev`` read: a container's holds a few dozen, a privileged one the host's few hundred.
DEV_ENTRY_LIMIT = 1024
#: Distinct ``NVIDIA_VISIBLE_DEVICES`` values kept per container.
ENV_VALUE_LIMIT = 16
#: Processes of one view tried in turn when the one tried changed its root or mount namespace while read.
VIEW_ATTEMPTS = 3
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_ROOT_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_CHUNK = 4096
_UNREAD = object()  # an environment that could not be read: asked again next time
_UNSEEN = object()  # a process whose environment was not read yet
#: What a process resolves paths from (see ``HostProc._view_key``): equal keys, equal views.
ViewKey = tuple[int, int] | tuple[str | None, int, int]
#: Why a path in a readable root names nothing to list: absent, not a directory, a link that dangles or loops.
_NOTHING_THERE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


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


@dataclass(frozen=True)
class ProcScan:
    """One scan of the host's processes.

    ``containers``: container id → the pids in it, ascending, for every container with a process on the host.
    ``placed``: pid → identity for every pid the scan found in a pod; the adapter's own table, good until the next
    scan (read it, never change it). ``nested``: container id → the other pods named by the cgroups below its own that
    its processes sit in, for the containers that have any.
    """

    containers: Mapping[str, Sequence[int]]
    placed: Mapping[int, CgroupIdentity]
    nested: Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class ContainerSight:
    """What the processes of one container show, judged over all of them.

    ``minors``: GPU device-node minors in the ``/dev`` of any of their views; None when no view could be read.
    ``visible_devices``: the distinct ``NVIDIA_VISIBLE_DEVICES`` values they set, sorted; ``env_read`` whether any
    environment could be read (an unset variable is left out). ``processes``: how many were judged. ``limits``: the
    bounds met, past which nothing was judged.
    """

    minors: frozenset[int] | None
    visible_devices: tuple[str, ...]
    env_read: bool
    processes: int
    limits: frozenset[ViewLimit] = frozenset()


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
    - In a process's root (:meth:`read_root_file`, :meth:`visible_minors`, :meth:`inspect`) a path resolves as in
      that root, never out of it; a FIFO, a device node or a socket is never opened, only a regular file read (at
      most ``ROOT_FILE_LIMIT`` bytes) and only a directory listed (at most ``DEV_ENTRY_LIMIT`` entries); a symlink
      that leaves the root, loops or dangles is ``None``.
    - Only listing the root raises (``OSError``, from :meth:`pids` and :meth:`scan`): a proc root that cannot be
      listed is a configuration error, unlike one process going away.

    ``recheck_scans``: how many scans re-read a process found outside any pod (0: none); ``startup_spread``: over
    how many scans the windows of the processes found by the first scan start (see the module docstring).
    ``openat2``: resolve in roots with ``openat2`` (None: where the kernel has it; False: the component walk).
    ``mount_ids``: key a process's view by the mount id of its root (None: where the kernel gives one; False: by its
    mount namespace and root inode, two reads).
    """

    def __init__(
        self,
        root: str = "/proc",
        *,
        recheck_scans: int = 2,
        startup_spread: int = 8,
        openat2: bool | None = None,
        mount_ids: bool | None = None,
    ) -> None:
        if recheck_scans < 0:
            raise ValueError(f"recheck_scans must be 0 or more, got {recheck_scans}")
        if startup_spread < 1:
            raise ValueError(f"startup_spread must be at least 1, got {startup_spread}")
        self.root = root
        self.recheck_scans = recheck_scans
        self.startup_spread = startup_spread
        self.openat2 = inroot.openat2_available() if openat2 is None else openat2
        use_mount_ids = inroot.mount_ids_available() if mount_ids is None else mount_ids
        self._mounts = inroot.MountIdentity() if use_mount_ids else None
        self._root_bytes = os.fsencode(root)
        #: cgroup files read so far; shows (in tests and metrics) that scans are incremental.
        self.cgroup_reads = 0
        self._inodes: dict[int, int] = {}  # every pid of the last scan → its inode << 1 | that scan's parity
        self._identities: dict[int, CgroupIdentity] = {}  # the pids of the last scan that are in a pod
        self._recheck: dict[int, int] = {}  # pids outside any pod with re-checks to come → the last scan to re-read
        self._parsed: dict[bytes, CgroupIdentity | None] = {}
        self._envs: dict[int, str | None] = {}  # pids in a pod → NVIDIA_VISIBLE_DEVICES when first read (None: unset)
        self._values: dict[str, str] = {}  # one object per distinct value, so that the table above holds no copies
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

    def window_end(self, pid: int, first_seen: int) -> int:
        """The last scan that re-reads ``pid``, found outside any pod by scan ``first_seen``; the window is the
        ``recheck_scans`` scans up to it. It follows the first sight, except after the auditor's first scan."""
        if self.recheck_scans == 0:
            return first_seen
        delay = pid % self.startup_spread if first_seen == 1 else 0
        return first_seen + delay + self.recheck_scans

    def scan(self) -> ProcScan:
        """Every container with a process on the host, with all its pids, and where each pid in a pod is.

        Incremental: lists the pids, reads the cgroup file only of pids new since the last call (or reused, or
        outside any pod and in their re-check window) and forgets vanished ones. Raises ``OSError`` as :meth:`pids`.

        The state is updated in place, never copied: each pid's entry holds its inode shifted left by one and, in the
        low bit, the parity of the last scan that listed it, so the pids this scan did not list are found at the end
        without a second table of every pid.
        """
        self._scans += 1
        scan, parity = self._scans, self._scans & 1
        inodes, identities, recheck, envs = self._inodes, self._identities, self._recheck, self._envs
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
                    envs.pop(pid, None)  # a new process: its environment is its own
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

        containers: dict[str, list[int]] = {}
        nested: dict[str, set[str]] = {}
        for pid, identity in identities.items():
            container = identity.container_id
            if container is not None:
                if container in containers:
                    containers[container].append(pid)
                else:
                    containers[container] = [pid]
                if identity.nested_pod_uid is not None:
                    nested.setdefault(container, set()).add(identity.nested_pod_uid)
        for pids in containers.values():
            pids.sort()
        return ProcScan(containers, identities, {container: frozenset(uids) for container, uids in nested.items()})

    def _forget(self, pid: int) -> None:
        del self._inodes[pid]
        self._identities.pop(pid, None)
        self._recheck.pop(pid, None)
        self._envs.pop(pid, None)

    # --- what a container's processes show -------------------------------------------------------------------

    def inspect(self, pids: Sequence[int]) -> ContainerSight:
        """What the processes ``pids`` (one container's, ascending) show: the union of the GPU device nodes of their
        views and every ``NVIDIA_VISIBLE_DEVICES`` value they set. See the module docstring for the bounds."""
        limits: set[ViewLimit] = set()
        if len(pids) > PROCESS_LIMIT:
            limits.add(ViewLimit.PROCESSES)
            pids = pids[:PROCESS_LIMIT]
        views: dict[ViewKey, list[int]] = {}
        values: set[str] = set()
        env_read = False
        judged = 0
        envs, root = self._envs, self._root_bytes
        of_root = self._mounts.of_process_root if self._mounts is not None else None
        for pid in pids:
            key = of_root(root, pid) if of_root is not None else self._view_key(pid)
            if key is None:
                continue  # exited
            judged += 1
            members = views.get(key)
            if members is None:
                views[key] = [pid]
            else:
                members.append(pid)
            value = envs.get(pid, _UNSEEN)
            if value is _UNSEEN:
                value = self._visible_devices(pid)
            if value is not _UNREAD:
                env_read = True
                if value is not None:
                    values.add(value)  # type: ignore[arg-type]
        if len(views) > VIEW_LIMIT:
            limits.add(ViewLimit.VIEWS)
        minors: set[int] | None = None
        for key, members in list(views.items())[:VIEW_LIMIT]:
            seen = self._view_minors(key, members, limits)
            if seen is not None:
                minors = seen if minors is None else minors | seen
        if len(values) > ENV_VALUE_LIMIT:
            limits.add(ViewLimit.ENV_VALUES)
        return ContainerSight(
            None if minors is None else frozenset(minors),
            tuple(sorted(values)[:ENV_VALUE_LIMIT]),
            env_read,
            judged,
            frozenset(limits),
        )

    def _view_key(self, pid: int) -> ViewKey | None:
        """What a live process resolves paths from: the mount and the inode of its root (one ``statx``; a new mount
        namespace copies every mount under new ids), or, where the kernel gives no mount ids, its mount namespace and
        its root's device and inode. Two processes with equal keys resolve every path alike. None when it is gone."""
        if self._mounts is not None:
            return self._mounts.of_process_root(self._root_bytes, pid)
        try:
            root = os.stat(f"{self.root}/{pid}/root")
        except OSError:
            return None
        return (self._mount_namespace(pid), root.st_dev, root.st_ino)

    def _held_key(self, pid: int, root: int) -> ViewKey | None:
        """The key of the root held open as ``root``, the one listed (a process that moves after it was opened
        changes the process's key, not what is listed). Without mount ids, its mount namespace is read again after."""
        if self._mounts is not None:
            return self._mounts.of_fd(root)
        held = os.fstat(root)
        return (self._mount_namespace(pid), held.st_dev, held.st_ino)

    def _mount_namespace(self, pid: int) -> str | None:
        try:
            return os.readlink(self._path(pid, "ns/mnt"))
        except OSError:
            return None

    def _view_minors(self, key: ViewKey, members: Sequence[int], limits: set[ViewLimit]) -> set[int] | None:
        """The GPU minors of one view, listed through one of its processes that still has it when read (its root held
        open while listing): a process that moved in between is not taken for the view it left. None when none could
        be read; ``UNSTABLE`` in ``limits`` when that was because the processes tried kept moving."""
        moved = False
        for pid in members[:VIEW_ATTEMPTS]:
            try:
                root = os.open(f"{self.root}/{pid}/root", _ROOT_FLAGS)
            except OSError:  # exited since it was keyed, or not ours to read
                continue
            held_first = self._mounts is not None  # a mount id is the held root's own; a namespace is read after
            try:
                if held_first and self._held_key(pid, root) != key:
                    moved = True
                    continue
                minors, complete = self._dev_minors(root)
                if not held_first and self._held_key(pid, root) != key:
                    moved = True
                    continue
            except OSError:
                continue
            finally:
                os.close(root)
            if not complete:
                limits.add(ViewLimit.DEV_ENTRIES)
            return minors
        if moved:
            limits.add(ViewLimit.UNSTABLE)
        return None

    def _dev_minors(self, root: int) -> tuple[set[int], bool]:
        """(GPU minors in ``/dev`` of the root held open, whether every entry was read). Raises ``OSError`` when the
        root cannot be read; a root with no ``/dev`` directory (a process chrooted into a bare tree, a ``/dev`` that is
        a file, a dangling or looping link) shows no device, as the container itself finds none there."""
        try:
            dev = inroot.open_directory(root, "dev", openat2=self.openat2)
        except inroot.WrongType:
            return set(), True
        except OSError as error:
            if error.errno in _NOTHING_THERE:
                return set(), True
            raise
        minors: set[int] = set()
        try:
            with os.scandir(dev) as entries:
                for count, entry in enumerate(entries):
                    if count == DEV_ENTRY_LIMIT:
                        return minors, False
                    # The entry's type comes with the listing: only character devices cost a stat.
                    if entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
                        continue
                    if entry.is_symlink():
                        continue
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISCHR(info.st_mode) and os.major(info.st_rdev) == NVIDIA_MAJOR:
                        minor = os.minor(info.st_rdev)
                        if minor not in NON_GPU_MINORS:
                            minors.add(minor)
        finally:
            os.close(dev)
        return minors, True

    def visible_minors(self, pid: int) -> frozenset[int] | None:
        """Minors of the GPU device nodes in one process's ``/dev``; None when its root cannot be read.

        Counts every character device directly in ``/dev`` with major 195 whatever its name (a node made under
        another name opens the same GPU) except ``nvidiactl`` and ``nvidia-modeset``; ``nvidia-uvm`` and
        ``nvidia-caps`` have other majors. ``/dev`` itself resolves inside the root; its entries are never followed
        through symlinks. At most ``DEV_ENTRY_LIMIT`` entries are read (:meth:`inspect` says when more were there).
        """
        try:
            root = os.open(self._path(pid, "root"), _ROOT_FLAGS)
        except OSError:  # ENOENT, ESRCH, EACCES: the process is gone or not ours to read
            return None
        try:
            return frozenset(self._dev_minors(root)[0])
        except OSError:
            return None
        finally:
            os.close(root)

    def _visible_devices(self, pid: int) -> str | object | None:
        """``NVIDIA_VISIBLE_DEVICES`` of a process in a pod as it started (None: unset; ``_UNREAD``: unreadable),
        read once per process."""
        try:
            return self._envs[pid]
        except KeyError:
            pass
        env = self.environ(pid, VISIBLE_DEVICES_ENV)
        if env is None:
            return _UNREAD
        value = env.get(VISIBLE_DEVICES_ENV)
        if value is not None:
            if len(self._values) >= PARSED_LIMIT:
                self._values.clear()
            value = self._values.setdefault(value, value)
        if pid in self._identities:  # a pid the next scans track, and forget when it exits
            self._envs[pid] = value
        return value

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
        """The first ``ROOT_FILE_LIMIT`` bytes of the regular file at ``path`` as the process's root resolves it, or
        None when there is none: the root is the container's own file system, and what it holds the container
        wrote (a symlink out of the root, a FIFO, a device node, a directory are None)."""
        try:
            root = os.open(self._path(pid, "root"), _ROOT_FLAGS)
        except OSError:
            return None
        try:
            return inroot.read_file(root, path, ROOT_FILE_LIMIT, openat2=self.openat2)
        except OSError:
            return None
        finally:
            os.close(root)
