"""The host /proc adapter on a real tree: files, character devices made with mknod, vanishing processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from auditor.cgroups import CONTAINERD, CRIO, CgroupIdentity
from auditor.hostproc import HostProc
from tests.fakes.hostproc_tree import NVIDIA_MAJOR, HostProcTree, cgroup_text, make_char_device

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


def test_pids_lists_only_processes(tree: HostProcTree) -> None:
    for pid in (300, 1, 42):
        tree.add_process(pid)
    assert HostProc(str(tree)).pids() == [1, 42, 300]


def test_a_missing_proc_root_is_an_error_not_an_empty_node(tmp_path: Path) -> None:
    proc = HostProc(str(tmp_path / "not-mounted"))
    with pytest.raises(FileNotFoundError, match="not-mounted"):
        proc.pids()
    with pytest.raises(FileNotFoundError, match="not-mounted"):
        proc.container_pids()


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
    pids = proc.pids()
    tree.remove(11)
    assert proc.identity(11) is None
    assert proc.identities(pids) == {10: CgroupIdentity(POD_A, C1, CONTAINERD)}
    assert proc.visible_minors(11) is None
    assert proc.environ(11, "PATH") is None


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
    assert proc.container_pids() == {C1: 10}
    assert proc.identities([10, 20, 30]) == {10: CgroupIdentity(POD_A, C1, CONTAINERD)}
    assert proc.visible_minors(30) is None
    assert proc.environ(30, "PATH") is None
    assert proc.environ(20, "PATH") is None


UNPRIVILEGED_PROBE = """
import json, sys
from auditor.hostproc import HostProc
proc = HostProc(sys.argv[1])
print(json.dumps({
    "identity": repr(proc.identity(40)),
    "container_pids": proc.container_pids(),
    "minors": repr(proc.visible_minors(40)),
    "environ": proc.environ(40, "NVIDIA_VISIBLE_DEVICES"),
    "other_minors": sorted(proc.visible_minors(41) or ()),
}))
"""


def test_permission_denied_reads_are_skipped(tree: HostProcTree) -> None:
    """Another user's process, as a reader without CAP_SYS_PTRACE/DAC_READ_SEARCH meets it on a real node."""
    locked = tree.add_container_process(40, POD_A, C1, environ={"NVIDIA_VISIBLE_DEVICES": "all"})
    tree.add_container_process(41, POD_A, C2, rootfs=tree.rootfs("open", gpu_minors=[2]))
    for name in ("cgroup", "environ", "root"):
        (locked / name).chmod(0)
    command = [sys.executable, "-c", UNPRIVILEGED_PROBE, str(tree)]
    if os.geteuid() == 0:  # root reads mode-0 files through CAP_DAC_OVERRIDE: run the probe without it
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    result = subprocess.run(
        command, capture_output=True, text=True, check=False, env={"PYTHONPATH": str(REPO)}, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "identity": "None",
        "container_pids": {C2: 41},
        "minors": "None",
        "environ": None,
        "other_minors": [2],
    }


def test_container_pids_picks_the_lowest_live_pid_per_container(tree: HostProcTree) -> None:
    tree.add_container_process(500, POD_A, C1)
    tree.add_container_process(120, POD_A, C1)
    tree.add_container_process(121, POD_A, PAUSE)  # the sandbox: reported, the audit decides
    tree.add_container_process(130, POD_B, C2, layout="systemd-crio")
    conmon = f"0::/kubepods.slice/kubepods-pod{POD_B.replace('-', '_')}.slice/crio-conmon-{C2}.scope\n"
    tree.add_process(131, cgroup=conmon)  # CRI-O's monitor of C2 is not C2
    tree.add_process(1, cgroup="0::/init.scope\n")
    assert HostProc(str(tree)).container_pids() == {C1: 120, PAUSE: 121, C2: 130}


def test_container_pids_reads_only_new_pids(tree: HostProcTree) -> None:
    for pid in range(100, 110):
        tree.add_container_process(pid, POD_A, C1)
    tree.add_process(1, cgroup="0::/init.scope\n")
    proc = HostProc(str(tree), recheck_every=1_000_000)
    assert proc.container_pids() == {C1: 100}
    assert proc.cgroup_reads == 11

    # Rewrite every known pid's cgroup file: had the second scan read them, C1 would move to another pod.
    for pid in range(100, 110):
        tree.write_cgroup(pid, cgroup_text(POD_B, C3))
    tree.write_cgroup(1, cgroup_text(POD_B, C3))
    tree.add_container_process(200, POD_B, C2)
    tree.remove(100)
    assert proc.container_pids() == {C1: 101, C2: 200}
    assert proc.cgroup_reads == 12  # only pid 200
    assert proc.identities([101, 200]) == {
        101: CgroupIdentity(POD_A, C1, CONTAINERD),
        200: CgroupIdentity(POD_B, C2, CONTAINERD),
    }
    assert proc.cgroup_reads == 12  # both known from the scan


def test_a_reused_pid_is_read_again(tree: HostProcTree) -> None:
    tree.add_container_process(100, POD_A, C1)
    proc = HostProc(str(tree), recheck_every=1_000_000)
    assert proc.container_pids() == {C1: 100}
    tree.reuse_pid(100, cgroup=cgroup_text(POD_B, C2))
    assert proc.container_pids() == {C2: 100}
    assert proc.identities([100]) == {100: CgroupIdentity(POD_B, C2, CONTAINERD)}


def test_identities_does_not_trust_the_scan_for_a_pid_reused_since(tree: HostProcTree) -> None:
    """A cycle asks for the identities of NVML's pids before it rescans: a pid the last scan placed in one container,
    reused since by a process of another, must not be billed to the first."""
    tree.add_container_process(100, POD_A, C1)
    proc = HostProc(str(tree), recheck_every=1_000_000)
    assert proc.container_pids() == {C1: 100}
    tree.reuse_pid(100, cgroup=cgroup_text(POD_B, C2))
    assert proc.identities([100]) == {100: CgroupIdentity(POD_B, C2, CONTAINERD)}
    tree.remove(100)
    assert proc.identities([100]) == {}  # exited since the scan: unknown, not the old container


def test_a_process_seen_outside_a_pod_is_rechecked(tree: HostProcTree) -> None:
    """Caught during ``runc init``, before it joined its container's cgroup."""
    tree.add_process(7, cgroup="0::/system.slice/containerd.service\n")
    proc = HostProc(str(tree), recheck_every=3)
    assert proc.container_pids() == {}
    tree.write_cgroup(7, cgroup_text(POD_A, C1))
    found = [proc.container_pids() for _ in range(3)]
    assert {C1: 7} in found
    assert proc.cgroup_reads == 2  # one read when first seen, one recheck within three scans


def test_identities_reads_pids_the_scan_placed_outside_pods(tree: HostProcTree) -> None:
    tree.add_process(7, cgroup="0::/system.slice/containerd.service\n")
    proc = HostProc(str(tree), recheck_every=1_000_000)
    proc.container_pids()
    tree.write_cgroup(7, cgroup_text(POD_A, C1))
    assert proc.identities([7]) == {7: CgroupIdentity(POD_A, C1, CONTAINERD)}


def test_recheck_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="recheck_every"):
        HostProc("/proc", recheck_every=0)


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
    assert HostProc(str(tree)).environ(10, "NVIDIA_VISIBLE_DEVICES") == expected


def test_environ_tolerates_bytes_that_are_not_utf8(tree: HostProcTree) -> None:
    tree.add_process(10, environ=b"A=\xff\xfe\0NVIDIA_VISIBLE_DEVICES=GPU-1\xff\0")
    proc = HostProc(str(tree))
    assert proc.environ(10, "NVIDIA_VISIBLE_DEVICES") == "GPU-1\ufffd"
    assert proc.environ(10, "A") == "\ufffd\ufffd"


# --- property: the incremental scan always agrees with a fresh full scan -------------------------------------------

_PODS = [POD_A, POD_B]
_CONTAINERS = [C1, C2, C3, PAUSE]
operations = st.lists(
    st.one_of(
        st.tuples(st.just("container"), st.sampled_from(_PODS), st.sampled_from(_CONTAINERS)),
        st.tuples(st.just("host")),
        st.tuples(st.just("exit"), st.integers(min_value=0, max_value=50)),
        st.tuples(st.just("reuse"), st.integers(min_value=0, max_value=50), st.sampled_from(_CONTAINERS)),
        st.tuples(st.just("scan")),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.integers(min_value=1, max_value=4))
# a pid reused twice: a fake tree that freed the first directory's inode handed it back on the second reuse
@example([("container", POD_A, C1), ("scan",), ("reuse", 0, C1), ("reuse", 0, C2)], 1)
def test_incremental_scan_matches_a_full_scan(steps: list[tuple], recheck_every: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        tree = HostProcTree(Path(directory) / "proc")
        incremental = HostProc(str(tree), recheck_every=recheck_every)
        live: list[int] = []
        next_pid = 100
        for step in steps:
            kind = step[0]
            if kind == "container":
                tree.add_container_process(next_pid, step[1], step[2], layout="cgroupfs", v1=next_pid % 2 == 0)
                live.append(next_pid)
                next_pid += 1
            elif kind == "host":
                tree.add_process(next_pid, cgroup="0::/system.slice/sshd.service\n")
                live.append(next_pid)
                next_pid += 1
            elif kind == "exit" and live:
                tree.remove(live.pop(step[1] % len(live)))
            elif kind == "reuse" and live:  # a new process gets an exited one's pid
                tree.reuse_pid(live[step[1] % len(live)], cgroup=cgroup_text(POD_B, step[2]))
            elif kind == "scan":
                assert incremental.container_pids() == HostProc(str(tree)).container_pids()
        assert incremental.container_pids() == HostProc(str(tree)).container_pids()
