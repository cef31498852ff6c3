"""The host /proc adapter on a real tree: files, character devices made with mknod, vanishing processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpu_fence.auditor import hostproc, inroot
from gpu_fence.auditor.cgroups import CONTAINERD, CRIO, CgroupIdentity, parse_cgroup
from gpu_fence.auditor.hostproc import ROOT_FILE_LIMIT, ContainerSight, HostProc
from gpu_fence.auditor.model import ViewLimit
from tests.fakes.hostproc_tree import (
    NVIDIA_MAJOR,
    HostProcTree,
    cgroup_text,
    flood_dev,
    make_char_device,
    plant_device,
    plant_fifo,
    plant_huge_file,
    plant_symlink,
    plant_text,
)
from tests.fakes.processes import run_captured

POD_A = "11111111-2222-4333-8444-555555555555"
POD_B = "66666666-7777-4888-9999-aaaaaaaaaaaa"
C1 = "c1" * 32
C2 = "c2" * 32
C3 = "c3" * 32
PAUSE = "ab" * 32
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path: Path) -> HostProcTree:
    return HostProcTree(tmp_path / "proc")


def containers(proc: HostProc) -> dict[str, list[int]]:
    """One scan: container id → its pids."""
    return {container: list(pids) for container, pids in proc.scan().containers.items()}


def lowest(proc: HostProc) -> dict[str, int]:
    """One scan: container id → its lowest pid (what the scan's incrementality tests compare)."""
    return {container: pids[0] for container, pids in proc.scan().containers.items()}


def test_pids_lists_only_processes(tree: HostProcTree) -> None:
    for pid in (300, 1, 42):
        tree.add_process(pid)
    assert HostProc(str(tree)).pids() == [1, 42, 300]


def test_a_missing_proc_root_is_an_error_not_an_empty_node(tmp_path: Path) -> None:
    proc = HostProc(str(tmp_path / "not-mounted"))
    assert not proc.root_is_directory() and HostProc(str(tmp_path)).root_is_directory()
    with pytest.raises(FileNotFoundError, match="not-mounted"):
        proc.pids()
    with pytest.raises(FileNotFoundError, match="not-mounted"):
        proc.scan()


def test_identity_per_layout(tree: HostProcTree) -> None:
    tree.add_container_process(10, POD_A, C1)
    tree.add_container_process(11, POD_B, C2, layout="cgroupfs-crio", qos="besteffort", v1=True)
    tree.add_process(12, cgroup="0::/system.slice/containerd.service\n")
    proc = HostProc(str(tree))
    assert proc.identity(10) == CgroupIdentity(POD_A, C1, CONTAINERD)
    assert proc.identity(11) == CgroupIdentity(POD_B, C2, CRIO)
    assert proc.identity(12) is None
    assert proc.identity(99) is None  # never existed


def test_a_pid_that_vanishes_after_listing_is_skipped(tree: HostProcTree) -> None:
    tree.add_container_process(10, POD_A, C1)
    tree.add_container_process(11, POD_A, C2)
    proc = HostProc(str(tree))
    assert proc.pids() == [10, 11]
    tree.remove(11)
    assert proc.identity(11) is None
    assert dict(proc.scan().placed) == {10: CgroupIdentity(POD_A, C1, CONTAINERD)}
    assert proc.visible_minors(11) is None
    assert proc.environ(11, "PATH") is None
    assert not proc.exists(11) and proc.exists(10)


def test_unreadable_entries_are_skipped_not_fatal(tree: HostProcTree) -> None:
    tree.add_container_process(10, POD_A, C1)
    (tree.root / "20").symlink_to("gone")  # listed, but every read fails with ENOENT (as for a reaped pid)
    odd = tree.add_process(30)
    (odd / "cgroup").unlink()
    (odd / "cgroup").mkdir()  # EISDIR instead of text
    (odd / "environ").unlink()
    (odd / "environ").mkdir()
    shutil.rmtree(odd / "root")
    (odd / "root").symlink_to(tree.root / "no-such-rootfs")  # the root of an exited process
    proc = HostProc(str(tree))
    assert containers(proc) == {C1: [10]}
    assert [proc.identity(pid) for pid in (10, 20, 30)] == [CgroupIdentity(POD_A, C1, CONTAINERD), None, None]
    assert proc.visible_minors(30) is None
    assert proc.environ(30, "PATH") is None
    assert proc.environ(20, "PATH") is None
    assert proc.read_root_file(30, "etc/hostname") is None
    assert proc.read_root_file(20, "etc/hostname") is None


UNPRIVILEGED_PROBE = """
import json, sys
from gpu_fence.auditor.hostproc import ROOT_FILE_LIMIT, HostProc
proc = HostProc(sys.argv[1])
print(json.dumps({
    "identity": repr(proc.identity(40)),
    "containers": {c: list(pids) for c, pids in proc.scan().containers.items()},
    "minors": repr(proc.visible_minors(40)),
    "environ": proc.environ(40, "NVIDIA_VISIBLE_DEVICES"),
    "root_file": proc.read_root_file(40, "etc/hostname"),
    "other_minors": sorted(proc.visible_minors(41) or ()),
    "other_root_file": proc.read_root_file(41, "etc/hostname").decode(),
}))
"""


def test_permission_denied_reads_are_skipped(tree: HostProcTree) -> None:
    """Another user's process, as a reader without CAP_SYS_PTRACE/DAC_READ_SEARCH meets it on a real node."""
    locked = tree.add_container_process(40, POD_A, C1, environ={"NVIDIA_VISIBLE_DEVICES": "all"})
    (locked / "root/etc").mkdir()
    (locked / "root/etc/hostname").write_text("locked")
    rootfs = tree.rootfs("open", gpu_minors=[2])
    (rootfs / "etc").mkdir()
    (rootfs / "etc/hostname").write_text("open")
    tree.add_container_process(41, POD_A, C2, rootfs=rootfs)
    for name in ("cgroup", "environ", "root"):
        (locked / name).chmod(0)
    command = [sys.executable, "-c", UNPRIVILEGED_PROBE, str(tree)]
    if os.geteuid() == 0:  # root reads mode-0 files through CAP_DAC_OVERRIDE: run the probe without it
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    result = run_captured(command, timeout=60, env={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "identity": "None",
        "containers": {C2: [41]},
        "minors": "None",
        "environ": None,
        "root_file": None,
        "other_minors": [2],
        "other_root_file": "open",
    }


def test_the_scan_lists_every_live_pid_of_each_container(tree: HostProcTree) -> None:
    tree.add_container_process(500, POD_A, C1)
    tree.add_container_process(120, POD_A, C1)
    tree.add_container_process(121, POD_A, PAUSE)  # the sandbox: reported, the audit decides
    tree.add_container_process(130, POD_B, C2, layout="systemd-crio")
    conmon = f"0::/kubepods.slice/kubepods-pod{POD_B.replace('-', '_')}.slice/crio-conmon-{C2}.scope\n"
    tree.add_process(131, cgroup=conmon)  # CRI-O's monitor of C2 is not C2
    tree.add_process(1, cgroup="0::/init.scope\n")
    assert containers(HostProc(str(tree))) == {C1: [120, 500], PAUSE: [121], C2: [130]}


def test_the_scan_reads_only_new_pids(tree: HostProcTree) -> None:
    for pid in range(100, 110):
        tree.add_container_process(pid, POD_A, C1)
    tree.add_process(1, cgroup="0::/init.scope\n")
    proc = HostProc(str(tree), recheck_scans=0)
    assert lowest(proc) == {C1: 100}
    assert proc.cgroup_reads == 11

    # Rewrite every known pid's cgroup file: had the second scan read them, C1 would move to another pod.
    for pid in range(100, 110):
        tree.write_cgroup(pid, cgroup_text(POD_B, C3))
    tree.write_cgroup(1, cgroup_text(POD_B, C3))
    tree.add_container_process(200, POD_B, C2)
    tree.remove(100)
    scan = proc.scan()
    assert {container: pids[0] for container, pids in scan.containers.items()} == {C1: 101, C2: 200}
    assert proc.cgroup_reads == 12  # only pid 200
    assert (scan.placed[101], scan.placed[200]) == (
        CgroupIdentity(POD_A, C1, CONTAINERD),
        CgroupIdentity(POD_B, C2, CONTAINERD),
    )


def test_a_reused_pid_is_read_again(tree: HostProcTree) -> None:
    tree.add_container_process(100, POD_A, C1)
    proc = HostProc(str(tree), recheck_scans=0)
    assert lowest(proc) == {C1: 100}
    tree.add_process(100, cgroup=cgroup_text(POD_B, C2), reusing=True)
    scan = proc.scan()
    assert dict(scan.containers) == {C2: [100]}
    assert scan.placed[100] == CgroupIdentity(POD_B, C2, CONTAINERD)


def test_a_process_seen_outside_a_pod_is_rechecked_during_its_window(tree: HostProcTree) -> None:
    """Caught during ``runc init``, before the runtime moved it into its container's cgroup: the next scans of its
    window read it again and find it in its container."""
    tree.add_process(7, cgroup="0::/system.slice/containerd.service\n")
    proc = HostProc(str(tree), recheck_scans=2, startup_spread=1)
    assert lowest(proc) == {}
    tree.write_cgroup(7, cgroup_text(POD_A, C1))
    assert lowest(proc) == {C1: 7}
    assert proc.cgroup_reads == 2  # one read when first seen, one re-check; in a pod now, so never read again
    assert lowest(proc) == {C1: 7} and proc.cgroup_reads == 2


def test_a_host_process_is_read_only_during_its_window(tree: HostProcTree) -> None:
    """Re-checks end after ``recheck_scans`` scans: a host process then costs nothing per scan, and one that joins
    a pod's cgroup later (which no runtime does) stays where it was found."""
    tree.add_process(7, cgroup="0::/system.slice/sshd.service\n")
    proc = HostProc(str(tree), recheck_scans=2, startup_spread=1)
    reads = []
    for _ in range(6):
        assert lowest(proc) == {}
        reads.append(proc.cgroup_reads)
    assert reads == [1, 2, 3, 3, 3, 3]  # first seen, then two re-checks, then none
    tree.write_cgroup(7, cgroup_text(POD_A, C1))
    assert lowest(proc) == {} and proc.cgroup_reads == 3
    # a process that starts later has a window of its own, counted from the scan that first saw it
    tree.add_process(8, cgroup="0::/system.slice/containerd.service\n")
    assert lowest(proc) == {} and proc.cgroup_reads == 4
    tree.write_cgroup(8, cgroup_text(POD_A, C2))
    assert lowest(proc) == {C2: 8}
    # a pid reused by a new process starts a new window too
    tree.add_process(7, cgroup="0::/system.slice/containerd.service\n", reusing=True)
    lowest(proc)
    tree.write_cgroup(7, cgroup_text(POD_B, C3))
    assert lowest(proc) == {C2: 8, C3: 7}


def test_the_windows_of_processes_found_at_start_are_spread(tree: HostProcTree) -> None:
    """The first scan finds the whole node: its host processes are re-checked in turns, by pid, so that no cycle after
    a start re-reads every process; processes that start later are re-checked at once."""
    for pid in range(100, 116):
        tree.add_process(pid, cgroup="0::/system.slice/sshd.service\n")
    proc = HostProc(str(tree), recheck_scans=1, startup_spread=4)
    reads = []
    for _ in range(7):
        lowest(proc)
        reads.append(proc.cgroup_reads)
    assert reads == [16, 20, 24, 28, 32, 32, 32]  # a quarter per scan, each process once, then none
    assert [proc.window_end(pid, 1) for pid in (100, 101, 103)] == [2, 3, 5]
    assert proc.window_end(103, 5) == 6  # found later: the very next scan
    # one caught joining its container after the first scan is found in its window (pid 103: the fourth scan after)
    fresh = HostProc(str(tree), recheck_scans=1, startup_spread=4)
    lowest(fresh)
    tree.write_cgroup(103, cgroup_text(POD_A, C1))
    assert [lowest(fresh) for _ in range(4)] == [{}, {}, {}, {C1: 103}]


def test_without_a_window_a_host_process_is_read_once(tree: HostProcTree) -> None:
    tree.add_process(7, cgroup="0::/init.scope\n")
    proc = HostProc(str(tree), recheck_scans=0)
    for _ in range(3):
        lowest(proc)
    assert proc.cgroup_reads == 1


def test_equal_cgroup_texts_are_parsed_once_and_the_memo_stays_bounded(
    tree: HostProcTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processes of one container have one cgroup text: it is parsed once per scan of the whole node, not once
    per process; past ``PARSED_LIMIT`` distinct texts the memo starts afresh instead of growing with the node (a
    text parsed before is then parsed again)."""
    parsed: list[str] = []
    monkeypatch.setattr(hostproc, "parse_cgroup", lambda text: parsed.append(text) or parse_cgroup(text))
    for pid in range(100, 110):
        tree.add_container_process(pid, POD_A, C1)
    tree.add_container_process(110, POD_B, C2)
    assert lowest(HostProc(str(tree))) == {C1: 100, C2: 110}
    assert len(parsed) == 2  # eleven processes, two texts

    a, b = CgroupIdentity(POD_A, C1, CONTAINERD), CgroupIdentity(POD_B, C2, CONTAINERD)

    def parses_of_a_b_a(proc: HostProc) -> int:
        parsed.clear()
        assert [proc.identity(pid) for pid in (100, 110, 101)] == [a, b, a]
        return len(parsed)

    assert parses_of_a_b_a(HostProc(str(tree))) == 2
    monkeypatch.setattr(hostproc, "PARSED_LIMIT", 1)
    assert parses_of_a_b_a(HostProc(str(tree))) == 3  # the second text pushed the first one out


def test_a_cgroup_file_longer_than_one_read_is_read_whole(tree: HostProcTree) -> None:
    """cgroup v1 hosts list one line per hierarchy; a long file arrives from /proc in pieces."""
    filler = "".join(f"{n}:name=h{n}:/system.slice/some-long-service-name-{n:04d}.service\n" for n in range(160))
    text = filler + cgroup_text(POD_A, C1, layout="cgroupfs", v1=True)
    assert len(text.encode()) > 2 * 4096
    tree.add_process(10, cgroup=text)
    proc = HostProc(str(tree))
    assert proc.identity(10) == CgroupIdentity(POD_A, C1, None)
    assert lowest(proc) == {C1: 10}


def test_window_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="recheck_scans"):
        HostProc("/proc", recheck_scans=-1)
    with pytest.raises(ValueError, match="startup_spread"):
        HostProc("/proc", startup_spread=0)


def test_visible_minors_counts_gpu_nodes_only(tree: HostProcTree) -> None:
    fs = tree.rootfs("gpu", gpu_minors=[0, 3], extra={"renamed-gpu": (NVIDIA_MAJOR, 6), "dri-card0": (226, 0)})
    dev = fs / "dev"
    (dev / "nvidia7").write_text("")  # a regular file, not a device
    (dev / "nvidia5").symlink_to("/dev/nvidia5")  # would resolve in the auditor's namespace: never followed
    sub = dev / "sub"
    sub.mkdir()
    make_char_device(sub / "nvidia4", NVIDIA_MAJOR, 4)  # only /dev itself counts
    tree.add_container_process(10, POD_A, C1, rootfs=fs)
    tree.add_container_process(11, POD_A, C1, rootfs=fs)
    assert HostProc(str(tree)).visible_minors(10) == frozenset({0, 3, 6})
    assert HostProc(str(tree)).visible_minors(11) == frozenset({0, 3, 6})


def test_visible_minors_without_gpus(tree: HostProcTree) -> None:
    controls_only = tree.rootfs("controls")  # nvidiactl, modeset, uvm, caps: no GPU
    tree.add_container_process(10, POD_A, C1, rootfs=controls_only)
    tree.add_container_process(11, POD_A, C2)  # an empty /dev
    proc = HostProc(str(tree))
    assert proc.visible_minors(10) == frozenset()
    assert proc.visible_minors(11) == frozenset()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ([("PATH", "/bin"), ("NVIDIA_VISIBLE_DEVICES", "all")], "all"),
        ([("NVIDIA_VISIBLE_DEVICES", "void"), ("NVIDIA_VISIBLE_DEVICES", "0,1")], "0,1"),  # last wins
        ([("NVIDIA_VISIBLE_DEVICES", "")], ""),
        ([("NVIDIA_VISIBLE_DEVICES", "a=b")], "a=b"),
        ([("NVIDIA_VISIBLE_DEVICES_EXTRA", "all"), ("XNVIDIA_VISIBLE_DEVICES", "all")], None),
        ([], None),  # kernel threads have an empty environ
    ],
)
def test_environ(tree: HostProcTree, environ: list[tuple[str, str]], expected: str | None) -> None:
    tree.add_process(10, environ=environ)
    found = HostProc(str(tree)).environ(10, "NVIDIA_VISIBLE_DEVICES")
    assert found is not None  # readable: an unset variable is left out, never None
    assert found.get("NVIDIA_VISIBLE_DEVICES") == expected
    assert ("NVIDIA_VISIBLE_DEVICES" in found) == (expected is not None)


def test_environ_tells_an_unset_variable_from_an_unreadable_environment(tree: HostProcTree) -> None:
    """The contract, in the manner of dcgm-exporter's ProcFS.ReadEnviron: absent is an answer (the name is left
    out), unreadable is unknown (None), so that "no NVIDIA_VISIBLE_DEVICES" is never claimed for a process not read."""
    tree.add_process(10, environ=[("PATH", "/bin")])
    gone = tree.add_process(11, environ=[("NVIDIA_VISIBLE_DEVICES", "all")])
    (gone / "environ").unlink()
    proc = HostProc(str(tree))
    assert proc.environ(10, "NVIDIA_VISIBLE_DEVICES") == {}
    assert proc.environ(11, "NVIDIA_VISIBLE_DEVICES") is None
    assert proc.environ(12, "NVIDIA_VISIBLE_DEVICES") is None  # no such process


def test_environ_reads_several_names_in_one_read(tree: HostProcTree) -> None:
    tree.add_process(10, environ=[("HOSTNAME", "train-0"), ("NVIDIA_VISIBLE_DEVICES", "0"), ("HOSTNAME", "train-1")])
    assert HostProc(str(tree)).environ(10, "NVIDIA_VISIBLE_DEVICES", "HOSTNAME", "HOME") == {
        "NVIDIA_VISIBLE_DEVICES": "0",
        "HOSTNAME": "train-1",  # the last occurrence wins
    }


def test_a_long_environment_is_read_whole(tree: HostProcTree) -> None:
    """The variable that counts may come after 100 KB of others (a CI image's environment)."""
    filler = [(f"FILLER_{n}", "x" * 1000) for n in range(100)]
    tree.add_process(10, environ=[*filler, ("NVIDIA_VISIBLE_DEVICES", "all")])
    assert HostProc(str(tree)).environ(10, "NVIDIA_VISIBLE_DEVICES") == {"NVIDIA_VISIBLE_DEVICES": "all"}


def test_environ_tolerates_bytes_that_are_not_utf8(tree: HostProcTree) -> None:
    tree.add_process(10, environ=b"A=\xff\xfe\0NVIDIA_VISIBLE_DEVICES=GPU-1\xff\0")
    proc = HostProc(str(tree))
    assert proc.environ(10, "NVIDIA_VISIBLE_DEVICES", "A") == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-1\ufffd",
        "A": "\ufffd\ufffd",
    }


def test_read_root_file_reads_a_bounded_prefix_of_a_file_in_the_processs_root(tree: HostProcTree) -> None:
    fs = tree.rootfs("named")
    secrets = fs / "var/run/secrets/kubernetes.io/serviceaccount"
    secrets.mkdir(parents=True)
    (secrets / "namespace").write_text("ml")
    (fs / "big").write_bytes(b"x" * (3 * ROOT_FILE_LIMIT))
    (fs / "a-directory").mkdir()
    tree.add_container_process(10, POD_A, C1, rootfs=fs)
    proc = HostProc(str(tree))
    assert proc.read_root_file(10, "var/run/secrets/kubernetes.io/serviceaccount/namespace") == b"ml"
    assert proc.read_root_file(10, "big") == b"x" * ROOT_FILE_LIMIT
    assert proc.read_root_file(10, "no-such-file") is None
    assert proc.read_root_file(10, "a-directory") is None
    assert proc.read_root_file(99, "big") is None  # no such process


# --- property: the incremental scan always agrees with a fresh full scan -------------------------------------------
#
# The model: a host process may join a pod container's cgroup (as ``runc init`` does). The incremental scan sees
# the join when a scan of the process's re-check window is still to come: the window ends ``recheck_scans`` scans
# after the scan that first saw it, plus ``pid % startup_spread`` scans when that was the first scan, and a join made
# before the window opens is seen by the window's first scan. Later joins (which no runtime makes) are, by design,
# not seen. The expected answer is a full scan of the tree in which every late joiner, and every joiner whose
# window has not opened yet, is still where the incremental scan last found it.

_PODS = [POD_A, POD_B]
_CONTAINERS = [C1, C2, C3, PAUSE]
_HOST_CGROUP = "0::/system.slice/sshd.service\n"
operations = st.lists(
    st.one_of(
        st.tuples(st.just("container"), st.sampled_from(_PODS), st.sampled_from(_CONTAINERS)),
        st.tuples(st.just("host")),
        st.tuples(st.just("exit"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("reuse"), st.integers(min_value=0, max_value=50), st.sampled_from(_CONTAINERS)),
        st.tuples(st.just("reuse-host"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("join"), st.integers(min_value=0, max_value=50), st.sampled_from(_CONTAINERS)),
        st.tuples(st.just("scan")),
    ),
    max_size=30,
)


def expected_scan(tree: HostProcTree, live: list[int], unseen: set[int]) -> dict[str, list[int]]:
    """A full scan of the tree, with unseen joiners left outside any pod: every live pid per container, ascending."""
    found: dict[str, list[int]] = {}
    reader = HostProc(str(tree))
    for pid in sorted(live):
        identity = None if pid in unseen else reader.identity(pid)
        if identity is not None and identity.container_id is not None:
            found.setdefault(identity.container_id, []).append(pid)
    return found


def window_end(pid: int, first_seen: int, recheck_scans: int, startup_spread: int) -> int:
    if recheck_scans == 0:
        return first_seen
    return first_seen + recheck_scans + (pid % startup_spread if first_seen == 1 else 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.integers(min_value=0, max_value=3), st.integers(min_value=1, max_value=3))
# a pid reused twice: a fake tree that freed the first directory's inode handed it back on the second reuse
@example([("container", POD_A, C1), ("scan",), ("reuse", 0, C1), ("reuse", 0, C2)], 1, 1)
# a join before the last scan of the window is seen; one scan later it is not
@example([("scan",), ("host",), ("scan",), ("scan",), ("join", 0, C1), ("scan",)], 2, 1)
@example([("scan",), ("host",), ("scan",), ("scan",), ("scan",), ("join", 0, C1), ("scan",)], 2, 1)
# found by the first scan: pid 100's window starts 100 % 3 = 1 scan later; found later: at once
@example([("host",), ("scan",), ("scan",), ("scan",), ("join", 0, C1), ("scan",)], 1, 3)
@example([("scan",), ("host",), ("scan",), ("scan",), ("join", 0, C1), ("scan",)], 1, 3)
# found by the first scan, joined before its window opens (scan 3): not seen by scan 2, seen by scan 3
@example([("host",), ("scan",), ("join", 0, C1)], 1, 3)
@example([("host",), ("scan",), ("join", 0, C1), ("scan",)], 1, 3)
def test_incremental_scan_matches_a_full_scan(steps: list[tuple], recheck_scans: int, startup_spread: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        tree = HostProcTree(Path(directory) / "proc")
        incremental = HostProc(str(tree), recheck_scans=recheck_scans, startup_spread=startup_spread)
        live: list[int] = []
        outside: dict[int, int | None] = {}  # live host processes → the scan that first saw them (None: not yet)
        late: set[int] = set()  # joined a pod after their window: the incremental scan keeps them outside
        opens: dict[int, int] = {}  # joined a pod before their window: pid → the scan that will see the join
        scans = 0

        def hidden(scan: int) -> set[int]:
            return late | {pid for pid, first_reading in opens.items() if scan < first_reading}

        next_pid = 100
        for step in steps:
            kind = step[0]
            if kind == "container":
                tree.add_container_process(next_pid, step[1], step[2], layout="cgroupfs", v1=next_pid % 2 == 0)
                live.append(next_pid)
                next_pid += 1
            elif kind == "host":
                tree.add_process(next_pid, cgroup=_HOST_CGROUP)
                live.append(next_pid)
                outside[next_pid] = None
                next_pid += 1
            elif kind == "exit" and live:
                pid = live.pop(step[1] % len(live))
                tree.remove(pid)
                outside.pop(pid, None)
                late.discard(pid)
                opens.pop(pid, None)
            elif kind in ("reuse", "reuse-host") and live:  # a new process gets an exited one's pid
                pid = live[step[1] % len(live)]
                late.discard(pid)
                opens.pop(pid, None)
                if kind == "reuse":
                    tree.add_process(pid, cgroup=cgroup_text(POD_B, step[2]), reusing=True)
                    outside.pop(pid, None)
                else:
                    tree.add_process(pid, cgroup=_HOST_CGROUP, reusing=True)
                    outside[pid] = None
            elif kind == "join" and outside:
                pid = sorted(outside)[step[1] % len(outside)]
                tree.write_cgroup(pid, cgroup_text(POD_A, step[2], layout="cgroupfs"))
                first = outside.pop(pid)
                if first is not None:
                    end = window_end(pid, first, recheck_scans, startup_spread)
                    if scans >= end:
                        late.add(pid)
                    else:
                        opens[pid] = end - recheck_scans + 1
            elif kind == "scan":
                scans += 1
                assert containers(incremental) == expected_scan(tree, live, hidden(scans))
                outside = {pid: scans if first is None else first for pid, first in outside.items()}
        assert containers(incremental) == expected_scan(tree, live, hidden(scans + 1))


# --- a container's root is the container's: every read stays inside it, never blocks, is bounded -----------------


@pytest.fixture(params=[True, False], ids=["openat2", "walk"])
def resolving(request: pytest.FixtureRequest) -> bool:
    """Whether the adapter resolves with openat2 or walks (both paths of ``auditor.inroot``; the walk forced)."""
    if request.param and not inroot.openat2_available():
        pytest.skip("this kernel has no openat2: the walk alone is used, and tested")
    return request.param


NAMESPACE_FILE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"


def hostile(tree: HostProcTree, plant: Callable[[Path], None], *, pid: int = 10, gpu_minors: Sequence[int] = ()) -> int:
    """A container process whose root the container has planted things in."""
    fs = tree.rootfs(f"hostile-{pid}", gpu_minors=gpu_minors)
    plant(fs)
    tree.add_container_process(pid, POD_A, C1, rootfs=fs)
    return pid


def test_read_root_file_never_follows_a_link_to_a_host_file(tree: HostProcTree, tmp_path: Path, resolving) -> None:
    token = tmp_path / "auditor-token"
    token.write_text("HOST SECRET")
    pid = hostile(tree, lambda fs: plant_symlink(fs, NAMESPACE_FILE, str(token)))
    relative = hostile(tree, lambda fs: plant_symlink(fs, NAMESPACE_FILE, "../" * 40 + str(token)[1:]), pid=11)
    proc = HostProc(str(tree), openat2=resolving)
    assert proc.read_root_file(pid, NAMESPACE_FILE) is None
    assert proc.read_root_file(relative, NAMESPACE_FILE) is None


def test_read_root_file_of_a_fifo_answers_at_once(tree: HostProcTree, resolving) -> None:
    """A FIFO in the namespace file hung the whole cycle while the API was down; now it is no file, at once (a
    blocked read would hang this test, which the suite's runner then reports)."""
    pid = hostile(tree, lambda fs: plant_fifo(fs, NAMESPACE_FILE))
    assert HostProc(str(tree), openat2=resolving).read_root_file(pid, NAMESPACE_FILE) is None


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda fs: plant_symlink(fs, NAMESPACE_FILE, "namespace"), id="symlink-loop"),
        pytest.param(lambda fs: plant_device(fs, NAMESPACE_FILE, 1, 3), id="device-node"),
        pytest.param(lambda fs: (fs / NAMESPACE_FILE).mkdir(parents=True), id="directory"),
        pytest.param(lambda fs: plant_symlink(fs, NAMESPACE_FILE, "/proc/self/environ"), id="magic-link"),
    ],
)
def test_read_root_file_of_anything_but_a_regular_file_is_none(tree: HostProcTree, plant, resolving) -> None:
    pid = hostile(tree, plant)
    assert HostProc(str(tree), openat2=resolving).read_root_file(pid, NAMESPACE_FILE) is None


def test_read_root_file_of_a_huge_file_reads_the_limit(tree: HostProcTree, resolving) -> None:
    pid = hostile(tree, lambda fs: plant_huge_file(fs, NAMESPACE_FILE, 16 << 30))
    assert HostProc(str(tree), openat2=resolving).read_root_file(pid, NAMESPACE_FILE) == b"\0" * ROOT_FILE_LIMIT


def test_read_root_file_follows_links_inside_the_root(tree: HostProcTree, resolving) -> None:
    """``/var/run`` is a link to ``/run`` in most images, and the kubelet's projected volume links ``namespace`` to
    ``..data/namespace``: resolved inside the root, both lead to the file."""

    def image(fs: Path) -> None:
        plant_text(fs, "run/secrets/kubernetes.io/serviceaccount/..2026/namespace", "ml")
        plant_symlink(fs, "run/secrets/kubernetes.io/serviceaccount/..data", "..2026")
        plant_symlink(fs, "run/secrets/kubernetes.io/serviceaccount/namespace", "..data/namespace")
        plant_symlink(fs, "var/run", "/run")

    pid = hostile(tree, image)
    assert HostProc(str(tree), openat2=resolving).read_root_file(pid, NAMESPACE_FILE) == b"ml"


def test_reads_of_a_vanished_pid_are_none(tree: HostProcTree, resolving) -> None:
    pid = hostile(tree, lambda fs: plant_text(fs, NAMESPACE_FILE, "ml"), gpu_minors=[0])
    proc = HostProc(str(tree), openat2=resolving)
    pids = proc.scan().containers[C1]
    tree.remove(pid)
    assert proc.read_root_file(pid, NAMESPACE_FILE) is None
    assert proc.visible_minors(pid) is None
    assert proc.inspect(pids) == ContainerSight(None, (), False, 0)


def test_a_dev_that_links_to_a_host_directory_is_listed_inside_the_root(
    tree: HostProcTree, tmp_path: Path, resolving
) -> None:
    """A ``/dev`` replaced by a link to an absolute path: followed from the auditor's side it would list the auditor's
    own directory (here one holding GPU nodes); resolved in the root, it is the container's directory of that name."""
    host_dev = tmp_path / "host-dev"
    host_dev.mkdir()
    make_char_device(host_dev / "nvidia3", NVIDIA_MAJOR, 3)

    def relink(fs: Path) -> None:
        shutil.rmtree(fs / "dev")
        plant_symlink(fs, "dev", str(host_dev))

    pid = hostile(tree, relink)
    assert HostProc(str(tree), openat2=resolving).visible_minors(pid) == frozenset()


def test_a_flooded_dev_is_read_up_to_its_bound(tree: HostProcTree, monkeypatch: pytest.MonkeyPatch, resolving) -> None:
    monkeypatch.setattr(hostproc, "DEV_ENTRY_LIMIT", 64)
    pid = hostile(tree, lambda fs: flood_dev(fs, 200), gpu_minors=[2])
    proc = HostProc(str(tree), openat2=resolving)
    sight = proc.inspect(proc.scan().containers[C1])
    assert sight.limits == {ViewLimit.DEV_ENTRIES}
    assert sight.minors is not None and sight.minors <= {2}  # what was read counts; the rest is not judged
    assert proc.visible_minors(pid) is not None


def test_a_flood_of_plain_files_costs_no_stat(tree: HostProcTree, monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing tells each entry's type: only character devices are looked at more closely."""
    pid = hostile(tree, lambda fs: flood_dev(fs, 500, devices=False), gpu_minors=[1])
    stats: list[str] = []

    class CountingEntry:
        def __init__(self, entry: os.DirEntry) -> None:
            self.entry = entry

        def __getattr__(self, name: str) -> Any:
            return getattr(self.entry, name)

        def stat(self, **options: Any) -> os.stat_result:
            stats.append(self.entry.name)
            return self.entry.stat(**options)

    class Counting:
        def __init__(self, target: int) -> None:
            self.entries = scandir(target)

        def __enter__(self) -> Iterator[CountingEntry]:
            return (CountingEntry(entry) for entry in self.entries.__enter__())

        def __exit__(self, *info: object) -> None:
            self.entries.__exit__(*info)

    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda target: Counting(target) if isinstance(target, int) else scandir(target))
    assert HostProc(str(tree)).visible_minors(pid) == {1}
    assert 0 < len(stats) < 20  # the GPU and the control nodes, not the 500 files


# --- a container is judged over all of its processes -------------------------------------------------------------


@pytest.fixture(params=[True, False], ids=["mount-id", "namespace"])
def keying(request: pytest.FixtureRequest) -> bool:
    """Whether a process's view is keyed by its root's mount id (one statx) or by its mount namespace and root inode
    (where the kernel gives no mount ids; forced here)."""
    if request.param and not inroot.mount_ids_available():
        pytest.skip("this kernel gives no mount ids: the namespace key alone is used, and tested")
    return request.param


def test_a_chrooted_lowest_pid_does_not_hide_its_siblings_devices(tree: HostProcTree, resolving, keying: bool) -> None:
    fs = tree.rootfs("main", gpu_minors=[0, 1])
    empty = tree.root.parent / "empty"
    empty.mkdir()
    for pid in (10, 11, 12):
        tree.add_container_process(pid, POD_A, C1, rootfs=fs)
    tree.chroot(10, empty)
    proc = HostProc(str(tree), openat2=resolving, mount_ids=keying)
    sight = proc.inspect(proc.scan().containers[C1])
    assert sight.minors == {0, 1} and sight.processes == 3 and sight.limits == frozenset()
    assert proc.visible_minors(10) == frozenset()  # the chrooted one alone sees nothing


def test_a_process_that_unshares_its_mounts_and_covers_dev_does_not_hide_its_siblings(
    tree: HostProcTree, keying: bool
) -> None:
    fs = tree.rootfs("main", gpu_minors=[3])
    covered = tree.rootfs("covered")  # the same tree with an empty /dev mounted over it
    for pid in (10, 11):
        tree.add_container_process(pid, POD_A, C1, rootfs=fs)
    tree.unshare_mounts(10, covered)
    proc = HostProc(str(tree), mount_ids=keying)
    assert proc.inspect(proc.scan().containers[C1]).minors == {3}


def test_views_are_listed_once_each_however_many_processes_share_them(
    tree: HostProcTree, monkeypatch: pytest.MonkeyPatch, keying: bool
) -> None:
    fs = tree.rootfs("main", gpu_minors=[0])
    other = tree.rootfs("other", gpu_minors=[1])
    for pid in range(10, 30):
        tree.add_container_process(pid, POD_A, C1, rootfs=fs)
    tree.unshare_mounts(29, other)
    listed = []
    real = inroot.open_directory
    monkeypatch.setattr(inroot, "open_directory", lambda *a, **k: listed.append(a[1]) or real(*a, **k))
    proc = HostProc(str(tree), mount_ids=keying)
    sight = proc.inspect(proc.scan().containers[C1])
    assert sight.minors == {0, 1} and sight.processes == 20
    assert listed == ["dev", "dev"]  # two views, twenty processes


def test_env_is_judged_over_every_process_and_read_once_each(
    tree: HostProcTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lowest pid that re-execs with ``void`` does not clear its siblings' ``all``; each process's environment is
    read when first seen, as the one it started with."""
    fs = tree.rootfs("main")
    tree.add_container_process(10, POD_A, C1, rootfs=fs, environ={"NVIDIA_VISIBLE_DEVICES": "void"})
    tree.add_container_process(11, POD_A, C1, rootfs=fs, environ={"NVIDIA_VISIBLE_DEVICES": "all"})
    tree.add_container_process(12, POD_A, C1, rootfs=fs, environ={"PATH": "/bin"})
    reads = []
    proc = HostProc(str(tree))
    real = proc.environ
    monkeypatch.setattr(proc, "environ", lambda pid, *names: reads.append(pid) or real(pid, *names))
    for _ in range(3):
        sight = proc.inspect(proc.scan().containers[C1])
        assert sight.visible_devices == ("all", "void") and sight.env_read
    assert reads == [10, 11, 12]
    tree.add_process(11, cgroup=cgroup_text(POD_A, C1), environ={"NVIDIA_VISIBLE_DEVICES": "0"}, reusing=True)
    assert proc.inspect(proc.scan().containers[C1]).visible_devices == ("0", "void")
    assert reads == [10, 11, 12, 11]  # a new process behind a reused pid is read anew


def test_an_unreadable_environment_is_unknown_and_asked_again(tree: HostProcTree) -> None:
    directory = tree.add_container_process(10, POD_A, C1, environ={"NVIDIA_VISIBLE_DEVICES": "all"})
    (directory / "environ").rename(directory / "environ.away")
    proc = HostProc(str(tree))
    assert proc.inspect(proc.scan().containers[C1]).env_read is False
    (directory / "environ.away").rename(directory / "environ")
    assert proc.inspect(proc.scan().containers[C1]).visible_devices == ("all",)


@pytest.mark.parametrize(
    ("bound", "value", "limit"),
    [
        ("PROCESS_LIMIT", 3, ViewLimit.PROCESSES),
        ("VIEW_LIMIT", 2, ViewLimit.VIEWS),
        ("ENV_VALUE_LIMIT", 2, ViewLimit.ENV_VALUES),
    ],
)
def test_past_a_bound_the_sight_says_so(  # noqa: PLR0917 - pytest passes each parameter by name
    tree: HostProcTree, monkeypatch: pytest.MonkeyPatch, bound: str, value: int, limit: ViewLimit, keying: bool
) -> None:
    """Five processes, each in a view of its own with a value of its own: past any bound, the container's sight says
    which (and the audit reports it), and what was read within the bounds still counts."""
    monkeypatch.setattr(hostproc, bound, value)
    for n in range(5):
        fs = tree.rootfs(f"view{n}", gpu_minors=[n])
        tree.add_container_process(10 + n, POD_A, C1, rootfs=fs, environ={"NVIDIA_VISIBLE_DEVICES": str(n)})
        tree.unshare_mounts(10 + n, fs)
    proc = HostProc(str(tree), mount_ids=keying)
    sight = proc.inspect(proc.scan().containers[C1])
    assert sight.limits == {limit}
    assert sight.minors is not None and {0, 1} <= sight.minors


def test_a_process_that_keeps_moving_while_read_makes_the_view_unstable(tree: HostProcTree, keying: bool) -> None:
    """A view is listed through a process that still has it: one that changes its root between being placed in a view
    and being listed is not taken for the view it left, and when every try moved, the sight says so."""
    fs = tree.rootfs("main", gpu_minors=[0])
    elsewhere = tree.rootfs("elsewhere")
    tree.add_container_process(10, POD_A, C1, rootfs=fs)

    proc = HostProc(str(tree), mount_ids=keying)
    # the process moves right after the auditor placed it in its view, whichever key placed it. Private on purpose:
    # the race lies between two private steps of one inspect() (keying a view, then listing it), where no public
    # call can put a move
    if keying:
        placed = proc._mounts.of_process_root
        proc._mounts.of_process_root = lambda root, pid: (placed(root, pid), tree.chroot(pid, elsewhere))[0]
    else:
        keyed = proc._view_key
        proc._view_key = lambda pid: (keyed(pid), tree.chroot(pid, elsewhere))[0]
    sight = proc.inspect(proc.scan().containers[C1])
    assert sight.minors is None and sight.limits == {ViewLimit.UNSTABLE}


def test_real_processes_that_chroot_or_unshare_their_mounts_each_add_a_view(
    tmp_path: Path, resolving: bool, keying: bool
) -> None:
    """On the kernel's own /proc, with its magic links: a real process chrooted into a tree holding a GPU node, one
    that unshared its mount namespace and mounted an empty /dev, and this one: three views, told apart by either key
    (the unshared one has this process's root directory: only its mount, its namespace, differs)."""
    tree = tmp_path / "chroot"
    (tree / "dev").mkdir(parents=True)
    make_char_device(tree / "dev" / "nvidia5", NVIDIA_MAJOR, 5)
    chrooted = subprocess.Popen(
        [sys.executable, "-c", f"import os, sys, time; os.chroot({str(tree)!r}); print(flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    unshared = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs none /dev && echo && sleep 60"],
        stdout=subprocess.PIPE,
    )
    try:
        for child in (chrooted, unshared):
            assert child.stdout is not None and child.stdout.readline() == b"\n"  # ready
        proc = HostProc("/proc", openat2=resolving, mount_ids=keying)
        pids = sorted([os.getpid(), chrooted.pid, unshared.pid])
        keys = {pid: proc._view_key(pid) for pid in pids}  # private on purpose: the key is what is tested
        assert len(set(keys.values())) == 3  # the unshared one has this process's root directory, in another mount
        assert os.stat(f"/proc/{unshared.pid}/root").st_ino == os.stat(f"/proc/{os.getpid()}/root").st_ino
        assert proc.visible_minors(chrooted.pid) == {5} and proc.visible_minors(unshared.pid) == frozenset()
        sight = proc.inspect(pids)
        assert sight.processes == 3 and sight.minors is not None and 5 in sight.minors and not sight.limits
    finally:
        for child in (chrooted, unshared):
            child.kill()
            child.wait()
