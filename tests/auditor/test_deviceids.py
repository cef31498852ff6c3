"""Kubelet device ids in every form a GPU plugin produces → the NVML UUID the auditor joins on."""

from __future__ import annotations

import uuid as uuidlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_fence.auditor.deviceids import DeviceRef, normalize_device_id, parse_device_id

GPU0 = "GPU-8f2c1d3e-0000-4a5b-9c8d-111111111111"
GPU1 = "GPU-8f2c1d3e-0000-4a5b-9c8d-222222222222"
MIG_0_3 = "MIG-2ce7a541-aaaa-5bbb-8ccc-333333333333"
MIG_1_0 = "MIG-2ce7a541-aaaa-5bbb-8ccc-444444444444"
GPUS = {0: GPU0, 1: GPU1}
MIGS = {(0, 3): MIG_0_3, (1, 0): MIG_1_0}
POSITIONS = {(0, 2): MIG_0_3}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (GPU0, GPU0),
        (f"{GPU0}::3", GPU0),  # NVIDIA time-slicing / MPS replica
        (f"{GPU1}::0", GPU1),
        (MIG_0_3, MIG_0_3),
        (f"{MIG_0_3}::7", MIG_0_3),  # EKS reports MIG replicas like this
        ("nvidia0", GPU0),  # GKE whole GPU
        ("nvidia1/vgpu1", GPU1),  # GKE time-sharing
        ("nvidia0/gi3", MIG_0_3),  # GKE MIG
        ("nvidia1/gi0/vgpu0", MIG_1_0),  # GKE time-shared MIG
        ("0", GPU0),  # index form
        ("1::2", GPU1),
        ("0:2", MIG_0_3),  # toolkit <gpu>:<mig device index> form
        (f"MIG-{GPU0}/3/0", MIG_0_3),  # pre-R470 MIG naming: parent GPU, GI, CI
        (f"MIG-{GPU1}/0/0::1", MIG_1_0),
        (" nvidia0 ", GPU0),
    ],
)
def test_every_known_form_maps_to_its_uuid(raw: str, expected: str) -> None:
    assert normalize_device_id(raw, GPUS, MIGS, migs_by_position=POSITIONS) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "::3",
        "GPU-",
        f"{GPU0}::x",  # replica must be a number
        f"{GPU0}::1::2",
        "nvidia7",  # no such index on this node
        "nvidia0/gi9",  # no such GPU instance
        "nvidia0::1",  # GKE ids take replicas as /vgpu<n>
        "nvidia0/vgpu1/gi0",
        "7",
        "0:5",
        f"MIG-{GPU0}/9/0",
        "MIG-GPU-ffffffff-0000-0000-0000-000000000000/0/0",  # parent GPU not on this node
        "MIG-GPU-abc",  # legacy prefix without instance ids
        "nvidia.com/gpu=0",  # a CDI name is not a device-plugin id
        "amd0",
        "GPU-a b",
        "GPU-x/y",
    ],
)
def test_unmappable_ids_give_none(raw: str) -> None:
    assert normalize_device_id(raw, GPUS, MIGS, migs_by_position=POSITIONS) is None


def test_mig_position_form_needs_the_position_map() -> None:
    assert normalize_device_id("0:2", GPUS, MIGS) is None


def test_uuids_not_on_this_node_pass_through_for_the_audit_to_judge() -> None:
    stranger = "GPU-00000000-1111-2222-3333-444444444444"
    assert normalize_device_id(f"{stranger}::1", {}, {}) == stranger


def test_parse_keeps_replica_and_slice_facts() -> None:
    assert parse_device_id(f"{GPU0}::3") == DeviceRef(f"{GPU0}::3", uuid=GPU0, replica=3)
    ref = parse_device_id("nvidia2/gi1/vgpu4")
    assert ref == DeviceRef("nvidia2/gi1/vgpu4", gpu_index=2, gpu_instance=1, replica=4)
    assert ref is not None and ref.is_mig
    whole = parse_device_id("nvidia2/vgpu4")
    assert whole is not None and not whole.is_mig and whole.replica == 4
    mig = parse_device_id(MIG_0_3)
    assert mig is not None and mig.is_mig


# --- properties ---------------------------------------------------------------------------------------------------

uuids = st.uuids().map(str)
indexes = st.integers(min_value=0, max_value=63)
instances = st.integers(min_value=0, max_value=14)
replicas = st.integers(min_value=0, max_value=10_000)


@given(uuids, st.sampled_from(["GPU", "MIG"]), st.none() | replicas)
def test_uuid_ids_normalise_to_themselves_with_or_without_replica(body: str, kind: str, replica: int | None) -> None:
    device = f"{kind}-{body}"
    raw = device if replica is None else f"{device}::{replica}"
    assert normalize_device_id(raw, {}, {}) == device


@given(st.dictionaries(indexes, uuids, min_size=1), st.data())
def test_every_gke_and_index_form_of_a_gpu_maps_to_its_uuid(table: dict[int, str], data: st.DataObject) -> None:
    gpus = {index: f"GPU-{body}" for index, body in table.items()}
    index = data.draw(st.sampled_from(sorted(gpus)))
    replica = data.draw(replicas)
    for raw in (f"nvidia{index}", f"nvidia{index}/vgpu{replica}", str(index), f"{index}::{replica}"):
        assert normalize_device_id(raw, gpus, {}) == gpus[index]


@given(st.dictionaries(st.tuples(indexes, instances), uuids, min_size=1), st.data())
def test_every_form_of_a_mig_slice_maps_to_its_uuid(table: dict[tuple[int, int], str], data: st.DataObject) -> None:
    migs = {key: f"MIG-{body}" for key, body in table.items()}
    gpus = {gpu: f"GPU-{uuidlib.UUID(int=gpu)}" for gpu, _ in migs}
    gpu, gi = data.draw(st.sampled_from(sorted(migs)))
    replica = data.draw(replicas)
    forms = (f"nvidia{gpu}/gi{gi}", f"nvidia{gpu}/gi{gi}/vgpu{replica}", f"MIG-{gpus[gpu]}/{gi}/0")
    for raw in forms:
        assert normalize_device_id(raw, gpus, migs) == migs[(gpu, gi)]
    # a slice is never its parent GPU
    assert normalize_device_id(f"nvidia{gpu}/gi{gi}", gpus, migs) != gpus[gpu]


@given(st.text(max_size=80))
def test_no_input_crashes_and_results_are_uuids(raw: str) -> None:
    result = normalize_device_id(raw, GPUS, MIGS, migs_by_position=POSITIONS)
    assert result is None or result.startswith(("GPU-", "MIG-"))
