"""Unit tests of the pure audit: hand-written nodes, one rule at a time."""

from __future__ import annotations

from gpu_fence.auditor.audit import audit, named_devices
from gpu_fence.auditor.model import (
    IDLE,
    Activity,
    AuditPolicy,
    ClaimedDevice,
    Container,
    DraResolution,
    FindingKind,
    Gpu,
    GpuProcess,
    NodeSnapshot,
)

G0, G1, G2 = (f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}" for i in range(3))
CARD = "GPU-77777777-aaaa-bbbb-cccc-777777777777"
MIG_A = "MIG-aaaaaaaa-0000-0000-0000-00000000000a"
MIG_B = "MIG-bbbbbbbb-0000-0000-0000-00000000000b"
GIB = 2**30

GPUS = (
    Gpu(G0, 0, 0, "H100", 80 * GIB),
    Gpu(G1, 1, 1, "H100", 80 * GIB),
    Gpu(G2, 2, 2, "H100", 80 * GIB),
)
MIG_GPUS = (
    Gpu(CARD, 0, 0, "A100", 40 * GIB, mig_enabled=True),
    Gpu(
        MIG_A, 0, 0, "A100", 20 * GIB, parent_uuid=CARD, mig_index=0, profile="3g.20gb", share=3 / 7, gpu_instance_id=1
    ),
    Gpu(
        MIG_B, 0, 0, "A100", 20 * GIB, parent_uuid=CARD, mig_index=1, profile="3g.20gb", share=3 / 7, gpu_instance_id=2
    ),
)


def container(name: str, cid: str, *, ns: str = "team", pod: str | None = None, **kw) -> Container:
    return Container(ns, pod or f"{name}-pod", name, pod_uid=f"uid-{name}", container_id=cid, **kw)


def node(containers, processes, gpus=GPUS) -> NodeSnapshot:
    return NodeSnapshot("node-a", 0.0, tuple(gpus), tuple(containers), tuple(processes))


def kinds(result) -> list[tuple[str, str | None, str | None]]:
    return [(f.kind.value, f.ref.container, f.gpu) for f in result.findings]


def test_exclusive_gpus_in_use_are_clean_and_metered():
    result = audit(
        node(
            [
                container(
                    "a", "c1", allocated=(G0,), visible=frozenset({G0}), visible_devices_envs=(G0,), env_read=True
                ),
                container("b", "c2", allocated=(G1,), visible=frozenset({G1})),
            ],
            [GpuProcess(10, G0, 5 * GIB, "uid-a", "c1"), GpuProcess(11, G1, GIB, "uid-b", "c2")],
        )
    )
    assert result.findings == ()
    rows = {r.ref.container: r for r in result.rows}
    assert rows["a"].used == (G0,) and dict(rows["a"].memory_bytes) == {G0: 5 * GIB}
    assert rows["b"].allocated == (G1,) and rows["b"].visible == (G1,)


def test_process_on_unallocated_gpu_is_used_unallocated_with_bytes_and_pid():
    result = audit(node([container("cuda", "c1")], [GpuProcess(4242, G2, 3 * GIB, "uid-cuda", "c1")]))
    (finding,) = result.findings
    assert finding.kind is FindingKind.USED_UNALLOCATED
    assert (finding.gpu, finding.pid, finding.memory_bytes) == (G2, 4242, 3 * GIB)
    assert "4242" in finding.message and "NVIDIA_VISIBLE_DEVICES=void" in finding.message
    assert dict(result.rows[0].memory_bytes) == {G2: 3 * GIB}


def test_time_slicing_replicas_entitle_every_sharing_container():
    pods = [container(f"s{i}", f"c{i}", allocated=(G0,), visible=frozenset({G0})) for i in range(4)]
    procs = [GpuProcess(100 + i, G0, (i + 1) * GIB, f"uid-s{i}", f"c{i}") for i in range(4)]
    result = audit(node(pods, procs))
    assert result.findings == ()
    assert sum(dict(r.memory_bytes)[G0] for r in result.rows) == 10 * GIB


def test_two_replicas_of_one_card_count_twice_in_allocation_counts():
    result = audit(node([container("a", "c1", allocated=(G0, G0))], []))
    assert result.rows[0].allocation_counts == ((G0, 2),)
    assert result.rows[0].allocated == (G0,)


def test_mig_sibling_slice_is_used_unallocated_but_own_slice_and_parent_node_are_fine():
    result = audit(
        node(
            [container("m", "c1", allocated=(MIG_A,), visible=frozenset({CARD}))],
            [GpuProcess(7, MIG_A, GIB, "uid-m", "c1"), GpuProcess(8, MIG_B, 2 * GIB, "uid-m", "c1")],
            MIG_GPUS,
        )
    )
    assert kinds(result) == [("used-unallocated", "m", MIG_B)]


def test_mig_slice_does_not_entitle_sibling_or_card_in_env():
    c = container("m", "c1", allocated=(MIG_A,), visible_devices_envs=("0",), env_read=True)
    result = audit(node([c], [], MIG_GPUS))
    assert kinds(result) == [("env-mismatch", "m", CARD)]


def test_container_seeing_all_gpus_but_using_none_is_visible_unallocated_only():
    result = audit(node([container("priv", "c1", visible=frozenset({G0, G1, G2}))], []))
    assert kinds(result) == [("visible-unallocated", "priv", g) for g in (G0, G1, G2)]
    assert "/dev/nvidia1" in result.findings[1].message


def test_host_process_is_unattributed_with_null_names_and_counted_per_gpu():
    result = audit(node([], [GpuProcess(1, G0, GIB, None, None), GpuProcess(2, G0, GIB, None, None)]))
    assert [f.kind for f in result.findings] == [FindingKind.UNATTRIBUTED_PROCESS] * 2
    assert all(f.ref.namespace is None and f.ref.pod is None and f.ref.container is None for f in result.findings)
    assert "host process" in result.findings[0].message
    assert result.unattributed_memory_bytes == ((G0, 2 * GIB),)


def test_process_that_exited_mid_read_is_unattributed_with_the_reason():
    result = audit(node([], [GpuProcess(9, G1, None, identity_error="process exited")]))
    (finding,) = result.findings
    assert finding.memory_bytes is None and "process exited" in finding.message


def test_env_all_on_partial_allocation_is_a_mismatch_and_void_none_are_fine():
    def env(value):
        return audit(node([container("e", "c1", allocated=(G0,), visible_devices_envs=(value,), env_read=True)], []))

    assert [f.kind for f in env("all").findings] == [FindingKind.ENV_MISMATCH]
    assert "and" not in env("all").findings[0].message.split("names")[0]
    assert env("void").findings == () and env("none").findings == () and env(None).findings == ()
    assert env(f"{G0}").findings == () and env("0").findings == ()
    assert kinds(env("0,2")) == [("env-mismatch", "e", G2)]
    assert kinds(env(f"nvidia.com/gpu={G1}")) == [("env-mismatch", "e", G1)]
    assert env("void,all").findings == ()  # void anywhere wins, as in the toolkit


def test_env_all_on_a_container_holding_every_gpu_is_fine():
    c = container("e", "c1", allocated=(G0, G1, G2), visible_devices_envs=("all",), env_read=True)
    assert audit(node([c], [])).findings == ()


def test_named_devices_forms():
    gpus = {g.uuid: g for g in MIG_GPUS}
    assert named_devices("0:1", gpus) == {MIG_B}
    # the pre-R470 MIG form names the slice in GPU instance 1 of the card, not the card
    assert named_devices(f"MIG-{CARD}/1/0", gpus) == {MIG_A}
    assert named_devices(f"MIG-{CARD}/5/0", gpus) == set()  # no such GPU instance here
    assert named_devices(f"MIG-{CARD}/1,MIG-{CARD}/x/0,MIG-{CARD}//", gpus) == set()  # malformed: names nothing
    legacy = f"MIG-{CARD}/2/0"  # drivers before R470 also report MIG UUIDs in this form
    assert named_devices(legacy, {**gpus, legacy: Gpu(legacy, 0, 0, parent_uuid=CARD, gpu_instance_id=7)}) == {legacy}
    assert named_devices("all", gpus) == {MIG_A, MIG_B}
    assert named_devices("GPU-not-here,7,weird", gpus) == frozenset()
    assert named_devices("/var/run/nvidia-container-devices", gpus) == frozenset()


def test_legacy_mig_form_of_the_containers_own_slice_is_no_env_mismatch():
    own = container("m", "c1", allocated=(MIG_A,), visible_devices_envs=(f"MIG-{CARD}/1/0",), env_read=True)
    sibling = container("s", "c2", allocated=(MIG_A,), visible_devices_envs=(f"MIG-{CARD}/2/0",), env_read=True)
    assert kinds(audit(node([own, sibling], [], MIG_GPUS))) == [("env-mismatch", "s", MIG_B)]


def test_exempt_namespace_gets_rows_but_no_findings():
    c = container("dcgm", "c1", ns="gpu-operator", visible=frozenset({G0, G1}), visible_devices_envs=("all",))
    result = audit(
        node([c], [GpuProcess(5, G0, GIB, "uid-dcgm", "c1")]),
        AuditPolicy(exempt_namespaces=frozenset({"gpu-operator"})),
    )
    assert result.findings == ()
    assert result.rows[0].exempt and dict(result.rows[0].memory_bytes) == {G0: GIB}


def test_kai_fraction_container_may_use_the_gpu_of_its_reservation_pod_only():
    reservation = container(
        "resource-reservation", "r1", ns="kai-resource-reservation", allocated=(G1,), kai_gpu_groups=frozenset({"g1"})
    )
    fraction = container(
        "train", "c1", kai_gpu_groups=frozenset({"g1"}), visible=frozenset({G1}), visible_devices_envs=("1",)
    )
    rogue = container("rogue", "c2", kai_gpu_groups=frozenset({"other"}), visible=frozenset({G1}))
    result = audit(
        node(
            [reservation, fraction, rogue],
            [GpuProcess(1, G1, GIB, "uid-train", "c1"), GpuProcess(2, G2, GIB, "uid-train", "c1")],
        )
    )
    assert kinds(result) == [("used-unallocated", "train", G2), ("visible-unallocated", "rogue", G1)]
    assert {r.ref.container: r.allocated for r in result.rows}["train"] == (G1,)


def test_process_with_unknown_container_id_is_unattributed_and_names_its_cgroup():
    result = audit(node([container("a", "c1", allocated=(G0,))], [GpuProcess(3, G0, GIB, "uid-x", "zzz")]))
    (finding,) = result.findings
    assert finding.kind is FindingKind.UNATTRIBUTED_PROCESS and "uid-x" in finding.message


def test_container_without_a_live_process_has_unknown_visibility_and_no_visibility_findings():
    result = audit(node([Container("ns", "p", "c", allocated=(G0,))], []))
    assert result.rows[0].visible is None and result.findings == ()


def test_used_unallocated_names_allocation_ids_that_could_not_be_mapped():
    lost = ClaimedDevice("ml", "gpu", "gpu.nvidia.com", "node-a", "gpu-0-mig-3g", (), DraResolution.NO_SLICE)
    c = container("dra", "c1", unresolved_allocations=("nvidia.com/gpu:odd-id",), dra_devices=(lost,))
    (finding,) = audit(node([c], [GpuProcess(1, G0, GIB, "uid-dra", "c1")])).findings
    assert "not mapped to a GPU: nvidia.com/gpu:odd-id, claim ml/gpu: gpu.nvidia.com/node-a/gpu-0-mig-3g" in (
        finding.message
    )


def test_a_dra_device_shared_by_containers_entitles_each_and_meters_each_by_its_memory():
    held = ClaimedDevice("ml", "shared", "gpu.nvidia.com", "node-a", "gpu-1", (), DraResolution.RESOLVED, G1)
    holders = [container(name, cid, allocated=(G1,), dra_devices=(held,)) for name, cid in (("a", "c1"), ("b", "c2"))]
    result = audit(node(holders, [GpuProcess(1, G1, GIB, "uid-a", "c1"), GpuProcess(2, G1, 3 * GIB, "uid-b", "c2")]))
    assert result.findings == ()
    assert [(r.ref.container, r.allocation_counts, r.memory_bytes) for r in result.rows] == [
        ("a", ((G1, 1),), ((G1, GIB),)),
        ("b", ((G1, 1),), ((G1, 3 * GIB),)),
    ]
    assert result.rows[0].dra_devices == (held,)


def test_processes_whose_memory_nvml_does_not_report_are_counted_per_gpu_not_taken_as_zero():
    result = audit(
        node(
            [container("a", "c1", allocated=(G0, G1))],
            [
                GpuProcess(1, G0, None, "uid-a", "c1"),
                GpuProcess(2, G0, GIB, "uid-a", "c1"),
                GpuProcess(3, G1, None, "uid-a", "c1"),
                GpuProcess(4, G1, None, "uid-a", "c1"),
            ],
        )
    )
    (row,) = result.rows
    assert dict(row.memory_bytes) == {G0: GIB, G1: 0}  # the contract's key keeps what is known
    assert dict(row.unknown_memory_processes) == {G0: 1, G1: 2}
    clean = audit(node([container("b", "c2", allocated=(G0,))], [GpuProcess(5, G0, GIB, "uid-b", "c2")]))
    assert clean.rows[0].unknown_memory_processes == ()


def test_process_in_a_pods_cgroup_but_in_no_container_is_said_so_naming_the_pod():
    """A process placed in the pod-level cgroup has a pod uid and no container id: 'container None' said nothing."""
    known = container("a", "c1", allocated=(G0,))
    result = audit(node([known], [GpuProcess(3, G0, GIB, "uid-a", None), GpuProcess(4, G0, GIB, "uid-x", None)]))
    messages = sorted(f.message for f in result.findings)
    assert all(f.kind is FindingKind.UNATTRIBUTED_PROCESS for f in result.findings)
    assert "None" not in " ".join(messages)
    ours = next(m for m in messages if m.startswith("process 3"))
    assert "in the cgroup of pod team/a-pod (uid uid-a) but in none of its containers" in ours
    other = next(m for m in messages if m.startswith("process 4"))
    assert "in the cgroup of pod uid uid-x but in none of its containers" in other
    assert "no pod with that uid is known on this node" in other


def test_process_with_a_container_id_but_no_pod_names_the_container():
    (finding,) = audit(node([], [GpuProcess(5, G0, GIB, None, "f" * 64)])).findings
    assert "None" not in finding.message and "container " + "f" * 64 in finding.message


# --- activity (operational, not billed) ---------------------------------------------------------------------


def sampled_node(containers, processes, gpus=GPUS, sampled=(G0, G1, G2)) -> NodeSnapshot:
    return NodeSnapshot(
        "node-a", 0.0, tuple(gpus), tuple(containers), tuple(processes), activity_devices=frozenset(sampled)
    )


def test_activity_sums_a_containers_processes_per_gpu_and_caps_each_engine_at_one():
    busy = Activity(sm=0.7, memory_controller=0.2, encoder=0.1)
    result = audit(
        sampled_node(
            [container("a", "c1", allocated=(G0,))],
            [
                GpuProcess(10, G0, GIB, "uid-a", "c1", activity=busy),
                GpuProcess(11, G0, GIB, "uid-a", "c1", activity=Activity(sm=0.6, decoder=0.3)),
                GpuProcess(12, G1, GIB, "uid-a", "c1", activity=Activity(sm=0.25)),
            ],
        )
    )
    assert dict(result.rows[0].activity) == {
        G0: Activity(sm=1.0, memory_controller=0.2, encoder=0.1, decoder=0.3),
        G1: Activity(sm=0.25),  # overreach is measured too; the metrics say allocated="false"
    }


def test_a_held_gpu_without_processes_is_idle_where_sampled_and_unknown_where_not():
    result = audit(
        sampled_node(
            [container("waiting", "c1", allocated=(G0, G1)), container("other", "c2")],
            [GpuProcess(20, G2, GIB, "uid-other", "c2", activity=Activity(sm=0.5))],
            sampled=(G0, G2),
        )
    )
    rows = {row.ref.container: row for row in result.rows}
    assert dict(rows["waiting"].activity) == {G0: IDLE}  # G1 is not sampled: no figure, not a zero
    assert dict(rows["other"].activity) == {G2: Activity(sm=0.5)}


def test_processes_on_a_device_nvml_does_not_sample_give_no_activity():
    result = audit(
        sampled_node(
            [container("slice", "c1", allocated=(MIG_A,))],
            [GpuProcess(30, MIG_A, GIB, "uid-slice", "c1")],
            gpus=MIG_GPUS,
            sampled=(),
        )
    )
    assert result.rows[0].activity == ()
