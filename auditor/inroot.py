"""Opening a path inside a container's root file system as that root's own, and never beyond it.

Everything under ``/proc/<pid>/root`` is written by the audited container. Resolved by the kernel from the auditor's
side, an absolute symlink there leads into the auditor's own file system (its service-account token), a chain of
``..`` out of the container's root; a FIFO blocks ``open`` until a writer comes; a device node runs its driver's
``open``. So a path is resolved with the container's root as ``/``:

- ``openat2(2)`` with ``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`` where the kernel has it (Linux 5.6; glibc has no
  wrapper, so through ``syscall(437, ...)``, the number on x86_64 and in the generic table of aarch64): absolute
  symlinks and ``..`` resolve inside the root, magic links (``/proc/<pid>/fd/*``) are refused (openat2(2): "Treat the
  directory referred to by dirfd as the root directory while resolving pathname"; ``include/uapi/linux/openat2.h``
  for ``struct open_how`` and the flags);
- else a walk, one component at a time, each opened ``O_PATH | O_NOFOLLOW`` from the directory before it (which
  ``O_NOFOLLOW`` alone cannot give: it guards the last component only). A symlink's text is spliced into the rest
  of the path, an absolute one restarting at the root; ``..`` goes back to the directory the walk came from, and at
  the root stays there, as the kernel's ``..`` does at a process's root; at most 40 links are followed (the kernel's
  ``MAXSYMLINKS``), so a loop ends in ``ELOOP``.

Both give an ``O_PATH`` descriptor: nothing is opened for reading, no FIFO blocks, no driver runs. Only then is the
object's type checked (``fstat``), and a regular file reopened for reading, non-blocking, through
``/proc/self/fd/<n>``, which reopens that very inode (a path could meanwhile name something else). A directory is
opened for listing with ``O_DIRECTORY``, which the kernel checks before any ``open`` runs (``do_open`` in
``fs/namei.c``): by openat2 in one call, or after the walk as ``.`` of the directory it found.

Errors are ``OSError`` with the kernel's errno (``ENOENT``, ``ELOOP``, ``EXDEV`` for an escape openat2 caught,
``ENOTDIR``), or :class:`WrongType` for an object that is not what the caller reads.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
from typing import Any

__all__ = [
    "MountIdentity",
    "WrongType",
    "mount_ids_available",
    "open_directory",
    "openat2_available",
    "read_file",
    "resolve",
]

#: ``SYS_openat2`` (``asm/unistd_64.h`` and ``asm-generic/unistd.h``).
SYS_OPENAT2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
#: Symlinks one resolution follows at most, as the kernel (``MAXSYMLINKS``).
MAX_SYMLINKS = 40
#: ``openat2`` answers ``EAGAIN`` when a concurrent rename kept it from checking a ``..``; openat2(2) says to retry.
_RETRIES = 3
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class WrongType(OSError):
    """The path resolved, inside the root, to an object of another type than the one read (a FIFO, a device node,
    a socket, a directory for a file)."""

    def __init__(self, path: str, mode: int, wanted: str) -> None:
        super().__init__(errno.EINVAL, f"not a {wanted} but {stat.filemode(mode)[0]!r}", path)


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


_HOW_SIZE = ctypes.sizeof(_OpenHow)


def _libc_function(name: str, restype: Any, argtypes: tuple[Any, ...]) -> Any:
    """libc's ``name``, typed once: ctypes then converts plain ints and bytes itself, the cheap way; errno kept."""
    function = getattr(ctypes.CDLL(None, use_errno=True), name)
    function.restype = restype
    function.argtypes = argtypes
    return function


@functools.cache
def _syscall() -> Any:
    return _libc_function(
        "syscall", ctypes.c_long, (ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
    )


@functools.cache
def _how(flags: int, resolve: int) -> tuple[_OpenHow, int]:
    """One ``struct open_how`` per way of opening (a handful), kept with its address: never changed once made."""
    how = _OpenHow(flags, 0, resolve)
    return how, ctypes.addressof(how)


def _openat2(directory: int, path: str, flags: int, resolve: int) -> int:
    _, address = _how(flags, resolve)
    # the empty path names the directory itself, as in the walk
    fd: int = _syscall()(SYS_OPENAT2, directory, (path or ".").encode("utf-8", "surrogateescape"), address, _HOW_SIZE)
    if fd < 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number), path)
    return fd


@functools.cache
def openat2_available() -> bool:
    """Whether this kernel (and the seccomp profile around the auditor) lets ``openat2`` resolve in a root: probed
    once, on ``/``, the first time it is asked.

    A kernel before 5.6 answers ``ENOSYS``, a seccomp profile older than the call ``EPERM`` or ``ENOSYS``, a kernel
    that does not know a resolve flag ``EINVAL`` or ``E2BIG``: any error means the walk, which is always right.
    """
    try:
        os.close(_openat2(-100, "/", os.O_PATH | os.O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS))  # AT_FDCWD
    except OSError:
        return False
    return True


def resolve(root: int, path: str, *, openat2: bool) -> int:
    """An ``O_PATH`` descriptor of what ``path`` names with the directory ``root`` as ``/``; the caller closes it."""
    if openat2:
        for _ in range(_RETRIES):
            try:
                return _openat2(root, path, os.O_PATH | os.O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
            except OSError as error:
                if error.errno != errno.EAGAIN:
                    raise
    return _walk(root, path)


def _walk(root: int, path: str) -> int:
    """``resolve`` without openat2: one component at a time, never following a link out of the root."""
    stack = [os.dup(root)]  # the directories from the root down to where the walk is; stack[0] is the root
    pending = _components(path)
    links = 0
    try:
        while pending:
            name = pending.pop()
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            fd = os.open(name, _PATH_FLAGS, dir_fd=stack[-1])
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                links += 1
                try:
                    target = os.readlink("", dir_fd=fd)
                finally:
                    os.close(fd)
                if links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                pending.extend(_components(target))
            elif not pending:
                return fd
            elif stat.S_ISDIR(mode):
                stack.append(fd)
            else:
                os.close(fd)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        return os.dup(stack[-1])  # the path named a directory: the root itself, or one reached by ".."
    finally:
        for fd in stack:
            os.close(fd)


def _components(path: str) -> list[str]:
    """The names of ``path`` in reverse order (the walk pops from the end), without empty and ``.`` ones."""
    return [name for name in reversed(path.split("/")) if name and name != "."]


def read_file(root: int, path: str, limit: int, *, openat2: bool) -> bytes:
    """At most ``limit`` bytes of the regular file ``path`` names inside ``root``; one read, never blocking."""
    found = resolve(root, path, openat2=openat2)
    try:
        mode = os.fstat(found).st_mode
        if not stat.S_ISREG(mode):
            raise WrongType(path, mode, "regular file")
        fd = os.open(f"/proc/self/fd/{found}", _READ_FLAGS)
    finally:
        os.close(found)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def open_directory(root: int, path: str, *, openat2: bool) -> int:
    """A descriptor, open for listing, of the directory ``path`` names inside ``root``; the caller closes it.

    With openat2 in one call: ``O_DIRECTORY`` refuses anything else (``ENOTDIR``) before any driver's ``open`` runs.
    A single plain name (``dev``) is first opened as it is, ``O_NOFOLLOW``: from the root, one name that is no link and
    no ``..`` cannot lead out of it, and that one ``open`` is what nearly every listing of a ``/dev`` needs.
    """
    if "/" not in path and path not in ("", ".", ".."):
        try:
            return os.open(path, _LIST_FLAGS | os.O_NOFOLLOW, dir_fd=root)
        except OSError as error:
            if error.errno not in (errno.ENOTDIR, errno.ELOOP):  # anything but a link or a non-directory
                raise
    if openat2:
        for _ in range(_RETRIES):
            try:
                return _openat2(root, path, _LIST_FLAGS, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
            except OSError as error:
                if error.errno != errno.EAGAIN:
                    raise
    found = _walk(root, path)
    try:
        mode = os.fstat(found).st_mode
        if not stat.S_ISDIR(mode):
            raise WrongType(path, mode, "directory")
        return os.open(".", _LIST_FLAGS, dir_fd=found)
    finally:
        os.close(found)


# --- which root a process resolves from ----------------------------------------------------------------------------

STATX_INO = 0x100
#: ``stx_mnt_id``, since Linux 5.8: "the mount ID of the mount containing the file" (statx(2)), the first field of
#: ``/proc/<pid>/mountinfo``. Every mount has its own, and a new mount namespace gets copies of every mount, each with
#: a new one.
STATX_MNT_ID = 0x1000
AT_EMPTY_PATH = 0x1000


class _Statx(ctypes.Structure):
    """The fields of ``struct statx`` (``include/uapi/linux/stat.h``) a mount identity needs, at their offsets."""

    _fields_ = (
        ("mask", ctypes.c_uint32),
        ("_before_ino", ctypes.c_uint8 * 0x1C),
        ("ino", ctypes.c_uint64),
        ("_before_mnt_id", ctypes.c_uint8 * 0x68),
        ("mnt_id", ctypes.c_uint64),
        ("_after", ctypes.c_uint8 * 0x68),
    )


@functools.cache
def _statx() -> Any:
    return _libc_function(
        "statx", ctypes.c_int, (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)
    )


class MountIdentity:
    """(mount id, inode) of a directory, by one ``statx``: two roots with equal identities resolve every path alike,
    being one directory of one mount, and so of one mount namespace's tree. Holds one buffer: not thread-safe."""

    def __init__(self) -> None:
        self._buffer = _Statx()
        self._address = ctypes.addressof(self._buffer)
        self._call = _statx()

    def of_path(self, path: bytes) -> tuple[int, int] | None:
        """The identity of what ``path`` names, following links (``/proc/<pid>/root`` is one); None when it cannot be
        read. The path is bytes: the caller encodes it once (``os.fsencode`` per call would cost more than the call)."""
        return self._read(-100, path, 0)  # AT_FDCWD

    def of_process_root(self, proc: bytes, pid: int) -> tuple[int, int] | None:
        """``of_path`` of ``<proc>/<pid>/root``, in one call: it runs for every process of every container."""
        if self._call(-100, b"%b/%d/root" % (proc, pid), 0, STATX_INO | STATX_MNT_ID, self._address) != 0:
            return None
        buffer = self._buffer
        return (buffer.mnt_id, buffer.ino) if buffer.mask & STATX_MNT_ID else None

    def of_fd(self, fd: int) -> tuple[int, int] | None:
        """The identity of the directory ``fd`` holds (an ``O_PATH`` descriptor will do)."""
        return self._read(fd, b"", AT_EMPTY_PATH)

    def _read(self, directory: int, path: bytes, flags: int) -> tuple[int, int] | None:
        buffer = self._buffer
        if self._call(directory, path, flags, STATX_INO | STATX_MNT_ID, self._address) != 0:
            return None
        if not buffer.mask & STATX_MNT_ID:
            return None
        return (buffer.mnt_id, buffer.ino)


@functools.cache
def mount_ids_available() -> bool:
    """Whether ``statx`` gives mount ids here (Linux 5.8, a C library with ``statx``): probed once, on ``/``."""
    if ctypes.sizeof(_Statx) != 0x100:
        return False
    try:
        return MountIdentity().of_path(b"/") is not None
    except (AttributeError, OSError):  # no statx in the C library
        return False
