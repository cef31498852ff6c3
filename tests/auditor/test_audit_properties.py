"""Property tests of the pure audit over generated nodes (full cards, MIG slices, replicas, host processes)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_fence.auditor.audit import audit, entitlement, kai_reservation_gpus
from gpu_fence.auditor.model import AuditPolicy, Container, FindingKind, Gpu, GpuProcess, NodeSnapshot, ViewLimit

ENV_VALUES = ["all", "void", "none", "0", "1,2", "0:0"]
MEMORY = st.none() | st.integers(0, 80 << 30)


@st.composite
def nodes(draw) -> NodeSnapshot:
    gpus: list[Gpu] = []
    for index in range(draw(st.integers(1, 4))):
        card = f"GPU-{index:08d}-0000-0000-0000-000000000000"
        mig = draw(st.booleans())
        gpus.append(Gpu(card, index, index, "H100", 80 << 30, mig_enabled=mig))
        if mig:
            for slot in range(draw(st.integers(1, 3))):
                gpus.append(
                    Gpu(
                        f"MIG-{index:04d}{slot:04d}-0000-0000-0000-000000000000",
                        index,
                        index,
                        "H100",
                        10 << 30,
                        parent_uuid=card,
                        mig_index=slot,
                    )
                )
    uuids = [g.uuid for g in gpus]
    containers = []
    for number in range(draw(st.integers(0, 6))):
        containers.append(
            Container(
                draw(st.sampled_from(["team-a", "team-b", "gpu-operator"])),
                f"pod{number}",
                "main",
                pod_uid=f"uid{number}",
                container_id=f"cid{number}",
                allocated=tuple(draw(st.lists(st.sampled_from(uuids), max_size=3))),
                visible=draw(st.none() | st.frozensets(st.sampled_from(uuids))),
                visible_devices_envs=tuple(
                    draw(st.lists(st.sampled_from(ENV_VALUES + uuids), max_size=3, unique=True))
                ),
                unconfirmed_allocations=draw(st.frozensets(st.sampled_from(uuids), max_size=2)),
                view_limits=draw(st.frozensets(st.sampled_from(list(ViewLimit)), max_size=2)),
            )
        )
    owners = [(c.pod_uid, c.container_id) for c in containers] + [(None, None), ("uid-gone", "cid-gone")]
    processes = [
        GpuProcess(pid, draw(st.sampled_from(uuids)), draw(MEMORY), *draw(st.sampled_from(owners)))
        for pid in range(1, draw(st.integers(0, 12)) + 1)
    ]
    return NodeSnapshot("n", 0.0, tuple(gpus), tuple(containers), tuple(processes))


POLICIES = st.sampled_from([AuditPolicy(), AuditPolicy(exempt_namespaces=frozenset({"gpu-operator"}))])


@settings(max_examples=150, deadline=None)
@given(nodes(), POLICIES)
def test_a_container_never_gets_a_finding_for_a_gpu_it_is_allocated(snapshot, policy):
    result = audit(snapshot, policy)
    reservations = kai_reservation_gpus(snapshot.containers, policy)
    allocated = {c.container_id: entitlement(c, reservations) for c in snapshot.containers}
    for finding in result.findings:
        if finding.ref.container_id in allocated and finding.gpu is not None:
            assert finding.gpu not in allocated[finding.ref.container_id]


@settings(max_examples=150, deadline=None)
@given(nodes(), POLICIES)
def test_attributed_plus_unattributed_memory_equals_nvml_total_per_gpu(snapshot, policy):
    result = audit(snapshot, policy)
    total: Counter[str] = Counter()
    for process in snapshot.processes:
        total[process.gpu_uuid] += process.used_memory_bytes or 0
    seen: Counter[str] = Counter(dict(result.unattributed_memory_bytes))
    for row in result.rows:
        seen.update(dict(row.memory_bytes))
    assert +seen == +total


@settings(max_examples=150, deadline=None)
@given(nodes(), POLICIES)
def test_every_process_is_either_in_a_row_or_an_unattributed_finding(snapshot, policy):
    result = audit(snapshot, policy)
    unattributed = {f.pid for f in result.findings if f.kind is FindingKind.UNATTRIBUTED_PROCESS}
    known = {c.container_id for c in snapshot.containers}
    for process in snapshot.processes:
        assert (process.pid in unattributed) != (process.container_id in known)


@settings(max_examples=150, deadline=None)
@given(nodes(), POLICIES)
def test_a_container_read_only_in_part_is_always_reported(snapshot, policy):
    """A bound met while reading a container is never a place to hide: it is a finding unless the namespace is
    exempt."""
    result = audit(snapshot, policy)
    incomplete = {f.ref.container_id for f in result.findings if f.kind is FindingKind.INCOMPLETE_VIEW}
    expected = {
        c.container_id for c in snapshot.containers if c.view_limits and c.namespace not in policy.exempt_namespaces
    }
    assert incomplete == expected


@settings(max_examples=150, deadline=None)
@given(nodes(), POLICIES, st.data())
def test_what_one_more_process_shows_never_takes_a_finding_away(snapshot, policy, data):
    """Visibility and env are judged over all of a container's processes: another process's view or value can add
    findings to its container, never remove one (a chrooted or re-exec'ed process cannot clear its siblings)."""
    if not snapshot.containers:
        return
    index = data.draw(st.integers(0, len(snapshot.containers) - 1))
    before = snapshot.containers[index]
    uuids = [g.uuid for g in snapshot.gpus]
    extra_value = data.draw(st.sampled_from(ENV_VALUES + uuids))
    extra_visible = data.draw(st.frozensets(st.sampled_from(uuids)))
    after = replace(
        before,
        visible_devices_envs=tuple(sorted({*before.visible_devices_envs, extra_value})),
        visible=(before.visible or frozenset()) | extra_visible,
    )
    containers = (*snapshot.containers[:index], after, *snapshot.containers[index + 1 :])
    grown = replace(snapshot, containers=containers)

    def judged(node: NodeSnapshot) -> set[tuple[FindingKind, str | None]]:
        return {(f.kind, f.ref.container_id) for f in audit(node, policy).findings}

    assert judged(snapshot) <= judged(grown)


@settings(max_examples=100, deadline=None)
@given(nodes())
def test_exempt_namespaces_never_get_findings_and_audit_is_deterministic(snapshot):
    policy = AuditPolicy(exempt_namespaces=frozenset({"gpu-operator"}))
    result = audit(snapshot, policy)
    assert all(f.ref.namespace != "gpu-operator" for f in result.findings)
    assert len(result.rows) == len(snapshot.containers)
    reversed_snapshot = NodeSnapshot(
        snapshot.node, snapshot.time, snapshot.gpus[::-1], snapshot.containers[::-1], snapshot.processes[::-1]
    )
    assert audit(reversed_snapshot, policy) == result
