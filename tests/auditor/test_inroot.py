"""Resolving paths inside a container's root (``auditor.inroot``), by openat2 and by the component walk, on a real
tree a hostile container could have written: host symlinks, ``..`` escapes, loops, FIFOs, device nodes, huge files."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_fence.auditor import inroot
from tests.fakes.hostproc_tree import (
    plant_device,
    plant_fifo,
    plant_huge_file,
    plant_symlink,
    plant_text,
)

#: A character major no driver has (Linux "local/experimental use"): opening such a node fails with ENXIO, so a
#: read that reports "not a regular file" instead proves it never opened the node.
NO_DRIVER_MAJOR = 240
LIMIT = 4096


def kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def test_this_kernel_has_openat2_and_the_probe_says_so() -> None:
    """openat2 appeared in Linux 5.6 (openat2(2), VERSIONS); the machines gpu-fence is built on run newer ones, so both
    paths run here: openat2, and the walk forced by the fixture below."""
    assert inroot.openat2_available() is (kernel() >= (5, 6))


@pytest.fixture(params=["openat2", "walk"])
def use_openat2(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Each test runs once per way to resolve, and proves that way was the one taken: the two ways are private, and
    which one ran is the point, so the other is replaced by one that fails."""
    if request.param == "openat2":
        if not inroot.openat2_available():
            pytest.skip("this kernel has no openat2: the walk alone is used, and tested")

        def no_walk(*_: Any) -> None:
            raise AssertionError("the walk ran although openat2 was asked for")

        monkeypatch.setattr(inroot, "_walk", no_walk)
        return True

    def no_openat2(*_: Any) -> None:
        raise AssertionError("openat2 ran although the walk was asked for")

    monkeypatch.setattr(inroot, "_openat2", no_openat2)
    return False


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A file of the auditor's own file system that a container must never get it to read."""
    secret = tmp_path / "host" / "token"
    secret.parent.mkdir()
    secret.write_text("HOST SECRET")
    return secret


@pytest.fixture
def root(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A container root (the path, and a descriptor held as ``/proc/<pid>/root`` gives one)."""
    path = tmp_path / "rootfs"
    (path / "dev").mkdir(parents=True)
    plant_text(path, "etc/hostname", "train-0\n")
    fd = os.open(path, os.O_PATH | os.O_DIRECTORY)
    yield path, fd
    os.close(fd)


def read(root: tuple[Path, int], path: str, use_openat2: bool) -> bytes:
    return inroot.read_file(root[1], path, LIMIT, openat2=use_openat2)


def test_a_plain_file_is_read(root, use_openat2) -> None:
    assert read(root, "etc/hostname", use_openat2) == b"train-0\n"
    assert read(root, "/etc/hostname", use_openat2) == b"train-0\n"


def test_symlinks_inside_the_root_are_followed_as_the_container_follows_them(root, use_openat2) -> None:
    """What real images and the kubelet's projected volumes hold: ``/var/run -> /run`` and the atomic writer's
    ``namespace -> ..data/namespace`` with ``..data -> ..<timestamp>``."""
    path, _ = root
    plant_text(path, "run/secrets/sa/..2026_01_01/namespace", "ml")
    plant_symlink(path, "run/secrets/sa/..data", "..2026_01_01")
    plant_symlink(path, "run/secrets/sa/namespace", "..data/namespace")
    plant_symlink(path, "var/run", "/run")
    assert read(root, "var/run/secrets/sa/namespace", use_openat2) == b"ml"


def test_an_absolute_symlink_to_a_host_file_resolves_inside_the_root(root, host, use_openat2) -> None:
    path, _ = root
    plant_symlink(path, "var/run/secrets/namespace", str(host))
    with pytest.raises(FileNotFoundError):
        read(root, "var/run/secrets/namespace", use_openat2)
    plant_text(path, str(host).lstrip("/"), "the container's own file at that path")
    assert read(root, "var/run/secrets/namespace", use_openat2) == b"the container's own file at that path"


def test_an_absolute_symlink_in_the_middle_of_the_path_resolves_inside_the_root(root, host, use_openat2) -> None:
    path, _ = root
    plant_symlink(path, "var/run", str(host.parent))  # the directory that holds the host's token
    with pytest.raises(FileNotFoundError):
        read(root, "var/run/token", use_openat2)


def test_a_relative_escape_stops_at_the_root(root, host, use_openat2) -> None:
    path, _ = root
    depth = len(host.parts) + 3
    plant_symlink(path, "var/run/namespace", "../" * depth + str(host).lstrip("/"))
    with pytest.raises(FileNotFoundError):
        read(root, "var/run/namespace", use_openat2)
    assert read(root, "../../../../etc/hostname", use_openat2) == b"train-0\n"  # ".." at the root is the root


def test_a_symlink_loop_ends(root, use_openat2) -> None:
    path, _ = root
    plant_symlink(path, "a", "b")
    plant_symlink(path, "b", "a")
    plant_symlink(path, "self", "self/x")
    for name in ("a", "self"):
        with pytest.raises(OSError) as raised:
            read(root, name, use_openat2)
        assert raised.value.errno == errno.ELOOP


def test_a_magic_link_is_never_a_way_out(root, use_openat2) -> None:
    """``/proc/self/root`` read from the auditor's side would be the auditor's own root: resolved in the container's
    root it names the container's own ``/proc``, which this one has not."""
    path, _ = root
    plant_symlink(path, "escape", "/proc/self/root/etc/hostname")
    with pytest.raises(FileNotFoundError):
        read(root, "escape", use_openat2)


def within(seconds: float, work: Callable[[], Any], unblock: Callable[[], None]) -> Any:
    """``work()``'s answer or error, failing the test if it takes longer (then ``unblock`` frees the thread)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # handed to the test thread
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        unblock()
        thread.join(5)
        pytest.fail(f"blocked for more than {seconds} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def test_a_fifo_is_never_opened_so_it_never_blocks(root, use_openat2) -> None:
    path, _ = root
    plant_fifo(path, "var/run/secrets/namespace")

    def writer() -> None:  # a blocked reader's open returns once a writer comes
        os.close(os.open(path / "var/run/secrets/namespace", os.O_WRONLY | os.O_NONBLOCK))

    with pytest.raises(inroot.WrongType):
        within(5, lambda: read(root, "var/run/secrets/namespace", use_openat2), writer)


def test_a_device_node_is_never_opened(root, use_openat2) -> None:
    path, _ = root
    plant_device(path, "namespace", NO_DRIVER_MAJOR, 0)
    with pytest.raises(OSError) as opened:
        os.close(os.open(path / "namespace", os.O_RDONLY | os.O_NONBLOCK))
    assert opened.value.errno in (errno.ENXIO, errno.ENODEV)  # what opening it would have done
    with pytest.raises(inroot.WrongType, match="not a regular file"):
        read(root, "namespace", use_openat2)


def test_a_huge_file_is_read_only_up_to_the_limit(root, use_openat2) -> None:
    path, _ = root
    plant_huge_file(path, "namespace", 8 << 30)
    assert read(root, "namespace", use_openat2) == b"\0" * LIMIT


def test_a_directory_is_not_read_as_a_file_nor_a_file_listed(root, use_openat2) -> None:
    path, fd = root
    (path / "var/run/secrets/namespace").mkdir(parents=True)
    with pytest.raises(inroot.WrongType):
        read(root, "var/run/secrets/namespace", use_openat2)
    with pytest.raises(OSError) as raised:
        os.close(inroot.open_directory(fd, "etc/hostname", openat2=use_openat2))
    assert isinstance(raised.value, inroot.WrongType) or raised.value.errno == errno.ENOTDIR


def test_a_file_below_a_file_is_not_a_directory(root, use_openat2) -> None:
    with pytest.raises(OSError) as raised:
        read(root, "etc/hostname/x", use_openat2)
    assert raised.value.errno == errno.ENOTDIR


def test_dev_as_a_symlink_to_a_host_directory_is_listed_inside_the_root(root, tmp_path, use_openat2) -> None:
    """A ``/dev`` the container replaced with a link to an absolute path lists the container's own directory of that
    name, never the auditor's."""
    path, fd = root
    host_dev = tmp_path / "host-dev"
    host_dev.mkdir()
    (host_dev / "host-only").touch()
    (path / "dev").rmdir()
    plant_symlink(path, "dev", str(host_dev))
    with pytest.raises(FileNotFoundError):
        os.close(inroot.open_directory(fd, "dev", openat2=use_openat2))
    (path / str(host_dev).lstrip("/")).mkdir(parents=True)
    (path / str(host_dev).lstrip("/") / "own").touch()
    listing = inroot.open_directory(fd, "dev", openat2=use_openat2)
    try:
        assert os.listdir(listing) == ["own"]
    finally:
        os.close(listing)


def test_the_root_itself_and_dot_dot_at_the_root_are_directories(root, use_openat2) -> None:
    path, fd = root
    for name in ("", "/", "..", "dev/../.."):
        listing = inroot.open_directory(fd, name, openat2=use_openat2)
        try:
            assert sorted(os.listdir(listing)) == sorted(os.listdir(path))
        finally:
            os.close(listing)


def test_this_kernel_gives_mount_ids() -> None:
    """``stx_mnt_id`` appeared in Linux 5.8 (statx(2)); older kernels key views by mount namespace, tested as well."""
    assert inroot.mount_ids_available() is (kernel() >= (5, 8))


def test_a_mount_identity_is_the_mount_and_the_inode_of_a_directory(tmp_path: Path) -> None:
    if not inroot.mount_ids_available():
        pytest.skip("this kernel gives no mount ids")
    identity = inroot.MountIdentity()
    (tmp_path / "a").mkdir()
    fd = os.open(tmp_path / "a", os.O_PATH | os.O_DIRECTORY)
    try:
        assert identity.of_path(os.fsencode(tmp_path / "a")) == identity.of_fd(fd)
    finally:
        os.close(fd)
    here, there = identity.of_path(os.fsencode(tmp_path)), identity.of_path(os.fsencode(tmp_path / "a"))
    assert here is not None and there is not None
    assert here[0] == there[0] and here[1] != there[1]  # one mount, two directories
    assert identity.of_path(b"/proc")[0] != here[0]  # another mount
    assert identity.of_path(os.fsencode(tmp_path / "gone")) is None
