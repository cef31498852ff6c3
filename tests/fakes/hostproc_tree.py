"""Builds a fake host ``/proc`` tree on disk for the auditor's /proc adapter.

Real files and real device nodes: ``<pid>/cgroup`` (text), ``<pid>/environ`` (NUL-separated), ``<pid>/ns/mnt``
(a symlink whose text names the mount namespace, as the kernel's ``mnt:[4026531840]``) and ``<pid>/root/dev`` with
character devices made by ``os.mknod`` (GPUs on major 195, ``nvidiactl`` 195:255, ``nvidia-modeset`` 195:254,
``nvidia-uvm`` and ``nvidia-caps`` on other majors, as on a real node). Processes of one container can share a root
file system, as on a real node, through a ``root`` symlink.

What a hostile container can do to its own root is planted with real objects too (``plant_*``): FIFOs, symlinks to
host files or out through ``..``, symlink loops, device nodes, huge files, a ``/dev`` flooded with entries; and to
its processes: a process that chroots into an empty tree (``chroot``), or unshares its mount namespace and covers
``/dev`` (``unshare_mounts``).

Making device nodes needs CAP_MKNOD (root); the tests run as root in CI.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

NVIDIA_MAJOR = 195
UVM_MAJOR = 509  # dynamic on a real node (read from /proc/devices); any major but 195 will do
CAPS_MAJOR = 508
MEM_MAJOR = 1  # /dev/null, /dev/zero: what a flood of harmless character devices is made of
#: The mount namespace of the host's processes, as ``readlink /proc/<pid>/ns/mnt`` shows it.
HOST_MOUNT_NAMESPACE = "mnt:[4026531840]"
_namespaces = itertools.count(4026532000)


def new_mount_namespace() -> str:
    """A mount namespace no process has yet, named as the kernel names one."""
    return f"mnt:[{next(_namespaces)}]"


#: How each runtime/driver pair names a container's cgroup (the kubelet's cgroup manager and each runtime).
_POD_SLICE = "/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid_}.slice"
LAYOUTS: Mapping[str, str] = {
    "systemd-containerd": _POD_SLICE + "/cri-containerd-{cid}.scope",
    "systemd-crio": _POD_SLICE + "/crio-{cid}.scope",
    "systemd-docker": _POD_SLICE + "/docker-{cid}.scope",
    "cgroupfs": "/kubepods/{qos}/pod{uid}/{cid}",
    "cgroupfs-crio": "/kubepods/{qos}/pod{uid}/crio-{cid}",
}


#: The runtime each layout stands for: the ``<runtime>://`` prefix of the container ids the API shows.
RUNTIMES: Mapping[str, str] = {
    "systemd-containerd": "containerd",
    "cgroupfs": "containerd",
    "systemd-crio": "cri-o",
    "cgroupfs-crio": "cri-o",
    "systemd-docker": "docker",
}


def container_cgroup(
    pod_uid: str, container_id: str, *, layout: str = "systemd-containerd", qos: str = "burstable"
) -> str:
    """The cgroup path of that container, as the kubelet and the runtime of ``layout`` name it."""
    return LAYOUTS[layout].format(uid=pod_uid, uid_=pod_uid.replace("-", "_"), cid=container_id, qos=qos)


def cgroup_text(
    pod_uid: str,
    container_id: str,
    *,
    layout: str = "systemd-containerd",
    qos: str = "burstable",
    v1: bool = False,
    hybrid: bool = False,
    below: str = "",
) -> str:
    """The ``/proc/<pid>/cgroup`` content of a process in that container (cgroup v2; v1 with several lines; or
    ``hybrid``, v1's lines and the unified hierarchy's), in a cgroup ``below`` the container's when given (one the
    container made itself)."""
    path = container_cgroup(pod_uid, container_id, layout=layout, qos=qos) + below
    if v1 or hybrid:
        lines = f"12:name=systemd:{path}\n11:memory:{path}\n10:pids:{path}\n4:cpu,cpuacct:{path}\n1:net_cls:/\n"
        return lines + (f"0::{path}\n" if hybrid else "")
    return f"0::{path}\n"


def nested_pod_cgroup(pod_uid: str, container_id: str, *, layout: str = "cgroupfs") -> str:
    """A cgroup path, to put below a container's own, named as the kubelet would name another pod's container."""
    return LAYOUTS[layout].format(uid=pod_uid, uid_=pod_uid.replace("-", "_"), cid=container_id, qos="burstable")


def container_mount_namespace(container_id: str) -> str:
    """The mount namespace the runtime gives a container (one per container, the same for all its processes)."""
    return f"mnt:[{4026540000 + int(hashlib.sha256(container_id.encode()).hexdigest()[:8], 16)}]"


def make_char_device(path: Path, major: int, minor: int) -> None:
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))


# --- what a container can plant in its own root --------------------------------------------------------------------


def _parent(root: Path, path: str) -> Path:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    return target


def plant_text(root: Path, path: str, text: str) -> None:
    _parent(root, path).write_text(text)


def plant_fifo(root: Path, path: str) -> None:
    """A FIFO no one writes to: a blocking open of it waits for ever."""
    os.mkfifo(_parent(root, path))


def plant_symlink(root: Path, path: str, target: str) -> None:
    """A symlink with the given text: absolute (``/etc/passwd``: the reader's own file if followed from outside), a
    chain of ``..`` out of the root, or another link (a loop)."""
    _parent(root, path).symlink_to(target)


def plant_device(root: Path, path: str, major: int, minor: int) -> None:
    make_char_device(_parent(root, path), major, minor)


def plant_huge_file(root: Path, path: str, size: int) -> None:
    """A sparse file of ``size`` bytes: costs nothing on disk, everything to read whole."""
    with _parent(root, path).open("wb") as file:
        file.truncate(size)


def flood_dev(root: Path, entries: int, *, devices: bool = True) -> None:
    """``entries`` more entries in ``/dev``: harmless character devices (every one costs a reader a ``stat``), or
    empty files."""
    dev = root / "dev"
    for number in range(entries):
        if devices:
            make_char_device(dev / f"flood{number}", MEM_MAJOR, 3)
        else:
            (dev / f"flood{number}").touch()


class HostProcTree:
    """A directory laid out like the host's /proc, grown process by process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._exited = 0
        root.mkdir(parents=True, exist_ok=True)
        # entries every real /proc has that are not processes
        (root / "meminfo").write_text("MemTotal: 1 kB\n")
        (root / "sys").mkdir(exist_ok=True)
        (root / "driver").mkdir(exist_ok=True)
        if not (root / "self").is_symlink():
            (root / "self").symlink_to("1")

    def __str__(self) -> str:
        return str(self.root)

    def rootfs(
        self,
        name: str,
        *,
        gpu_minors: Iterable[int] = (),
        control_nodes: bool = True,
        extra: Mapping[str, tuple[int, int]] | None = None,
    ) -> Path:
        """A container root file system with ``/dev`` holding the given GPUs (and, by default, the control nodes
        a GPU container gets: nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools, nvidia-caps/)."""
        fs = self.root / "_rootfs" / name
        dev = fs / "dev"
        dev.mkdir(parents=True)
        (dev / "null").touch()  # a regular file stands in for the other nodes
        for minor in gpu_minors:
            make_char_device(dev / f"nvidia{minor}", NVIDIA_MAJOR, minor)
        if control_nodes:
            make_char_device(dev / "nvidiactl", NVIDIA_MAJOR, 255)
            make_char_device(dev / "nvidia-modeset", NVIDIA_MAJOR, 254)
            make_char_device(dev / "nvidia-uvm", UVM_MAJOR, 0)
            make_char_device(dev / "nvidia-uvm-tools", UVM_MAJOR, 1)
            (dev / "nvidia-caps").mkdir()
            make_char_device(dev / "nvidia-caps" / "nvidia-cap1", CAPS_MAJOR, 1)
            make_char_device(dev / "nvidia-caps" / "nvidia-cap2", CAPS_MAJOR, 2)
        for node, (major, minor) in (extra or {}).items():
            make_char_device(dev / node, major, minor)
        return fs

    def add_process(
        self,
        pid: int,
        *,
        cgroup: str = "0::/\n",
        environ: Mapping[str, str] | Sequence[tuple[str, str]] | bytes = (),
        rootfs: Path | None = None,
        mount_namespace: str = HOST_MOUNT_NAMESPACE,
        reusing: bool = False,
    ) -> Path:
        """Add ``/proc/<pid>``; ``environ`` pairs are written in order (duplicates allowed), bytes as given.

        ``reusing``: a new process takes over an exited one's pid. The new directory exists before the old one
        goes, so it cannot get the old inode number back, as a real new process gets a new inode in procfs."""
        directory = self.root / str(pid)
        staging = self.root / f"_new_{pid}" if reusing else directory
        staging.mkdir()
        self._fill(staging, cgroup, environ, rootfs, mount_namespace)
        if reusing:
            self.remove(pid)
            staging.rename(directory)
        return directory

    def add_container_process(
        self,
        pid: int,
        pod_uid: str,
        container_id: str,
        *,
        rootfs: Path | None = None,
        environ: Mapping[str, str] | Sequence[tuple[str, str]] | bytes = (),
        layout: str = "systemd-containerd",
        qos: str = "burstable",
        v1: bool = False,
        mount_namespace: str | None = None,
        below: str = "",
    ) -> Path:
        """Add a process running in that pod's container (its cgroup file in the given layout, in a cgroup ``below``
        the container's if given). Its mount namespace is the container's unless given."""
        text = cgroup_text(pod_uid, container_id, layout=layout, qos=qos, v1=v1, below=below)
        namespace = mount_namespace or container_mount_namespace(container_id)
        return self.add_process(pid, cgroup=text, environ=environ, rootfs=rootfs, mount_namespace=namespace)

    def chroot(self, pid: int, rootfs: Path) -> None:
        """The process changes its root (``chroot``), in the mount namespace it has."""
        root = self.root / str(pid) / "root"
        root.unlink()
        root.symlink_to(rootfs, target_is_directory=True)

    def unshare_mounts(self, pid: int, rootfs: Path) -> None:
        """The process unshares its mount namespace and mounts over what it sees (``/dev``, say): a namespace of its
        own, and the tree it now sees."""
        self.chroot(pid, rootfs)
        link = self.root / str(pid) / "ns" / "mnt"
        link.unlink()
        link.symlink_to(new_mount_namespace())

    def remove(self, pid: int) -> None:
        """The process exits.

        Its directory is moved out of the tree rather than deleted: procfs never hands a new process the inode
        number of an exited one soon after, but a disk file system would reuse the freed inode at once, and the
        adapter's pid-reuse check (a changed inode) would then see a reused pid as unchanged.
        """
        directory = self.root / str(pid)
        if directory.is_symlink():
            directory.unlink()
            return
        self._exited += 1
        graveyard = self.root.parent / f".{self.root.name}-exited"
        graveyard.mkdir(exist_ok=True)
        directory.rename(graveyard / f"{pid}-{self._exited}")

    def write_cgroup(self, pid: int, text: str) -> None:
        (self.root / str(pid) / "cgroup").write_text(text)

    @staticmethod
    def _fill(
        directory: Path,
        cgroup: str,
        environ: Mapping[str, str] | Sequence[tuple[str, str]] | bytes,
        rootfs: Path | None,
        mount_namespace: str,
    ) -> None:
        (directory / "cgroup").write_text(cgroup)
        (directory / "ns").mkdir()
        (directory / "ns" / "mnt").symlink_to(mount_namespace)
        if isinstance(environ, bytes):
            data = environ
        else:
            pairs = environ.items() if isinstance(environ, Mapping) else environ
            data = b"".join(f"{key}={value}".encode() + b"\0" for key, value in pairs)
        (directory / "environ").write_bytes(data)
        if rootfs is not None:
            (directory / "root").symlink_to(rootfs, target_is_directory=True)
        else:
            (directory / "root" / "dev").mkdir(parents=True)
