"""DRA devices to UUIDs (``auditor.dra``), pure: the slice index in every API version and driver release, and how a
claimed device resolves, or says why it does not."""

from __future__ import annotations

import pytest

from gpu_fence.auditor.dra import SliceIndex, SliceView, claimed_devices, slice_note
from gpu_fence.auditor.model import DraResolution, SliceState
from gpu_fence.auditor.podresources.allocations import ClaimDevice, DynamicResource
from tests.fakes.kubeapi_resourceslices import (
    RELEASES,
    VERSIONS,
    DraGpu,
    DraMig,
    compute_domain_slice,
    gpu_name,
    in_version,
    mig_name,
    nvidia_slice,
)

NODE = "node-a"
DRIVERS = frozenset({"gpu.nvidia.com"})
# minors differ from indices, as on many real nodes
GPUS = (DraGpu(0, 2, "GPU-aaaa"), DraGpu(1, 0, "GPU-bbbb"), DraGpu(2, 1, "GPU-cccc"))
MIGS = (DraMig(GPUS[2], "MIG-c0", "3g.40gb", 0, 4), DraMig(GPUS[2], "MIG-c4", "3g.40gb", 4, 4))


def index_of(*slices, drivers=DRIVERS) -> SliceIndex:
    return SliceIndex.build(slices, drivers)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("release", RELEASES)
def test_every_release_and_version_maps_each_name_to_its_uuid(release, version):
    index = index_of(in_version(nvidia_slice(NODE, GPUS, MIGS, release=release), version))
    expected = {gpu_name(gpu, release): gpu.uuid for gpu in GPUS[:2]} | {mig_name(m, release): m.uuid for m in MIGS}
    assert {key[2]: device.uuid for key, device in index.devices.items()} == expected
    assert all(key[:2] == ("gpu.nvidia.com", NODE) for key in index.devices)
    mig = index.get("gpu.nvidia.com", NODE, mig_name(MIGS[1], release))
    assert mig is not None and (mig.parent_uuid, mig.profile) == ("GPU-cccc", "3g.40gb")


def test_names_are_never_read_for_a_uuid():
    """``gpu-0`` names the GPU of minor 0 in one release and of index 0 in another: only the attribute decides."""
    by_minor = index_of(nvidia_slice(NODE, GPUS, release="v25.12"))
    by_index = index_of(nvidia_slice(NODE, GPUS, release="v25.2"))
    assert by_minor.get("gpu.nvidia.com", NODE, "gpu-0").uuid == "GPU-bbbb"  # type: ignore[union-attr]
    assert by_index.get("gpu.nvidia.com", NODE, "gpu-0").uuid == "GPU-aaaa"  # type: ignore[union-attr]


def test_other_drivers_are_not_ours_unless_configured():
    assert index_of(compute_domain_slice(NODE)).devices == {}
    assert len(index_of(compute_domain_slice(NODE), drivers={"compute-domain.nvidia.com"}).devices) == 2


def test_only_the_newest_generation_of_a_pool_counts():
    old = nvidia_slice(NODE, GPUS, release="v25.8", generation=1, name="old")
    new = nvidia_slice(NODE, GPUS[:1], release="v25.8", generation=2, name="new")
    assert {key[2] for key in index_of(old, new).devices} == {"gpu-2"}
    assert {key[2] for key in index_of(new, old).devices} == {"gpu-2"}


def test_an_attribute_may_carry_the_drivers_domain():
    obj = nvidia_slice(NODE, GPUS[:1])
    attributes = obj["spec"]["devices"][0]["attributes"]
    attributes["gpu.nvidia.com/uuid"] = attributes.pop("uuid")
    assert index_of(obj).get("gpu.nvidia.com", NODE, "gpu-2").uuid == "GPU-aaaa"  # type: ignore[union-attr]


def test_malformed_slices_and_devices_are_skipped_not_fatal():
    good = nvidia_slice(NODE, GPUS[:1], name="good")
    bad_devices = nvidia_slice(NODE, GPUS[1:2], name="bad")
    bad_devices["spec"]["pool"]["name"] = "pool-b"
    bad_devices["spec"]["devices"] += [{"name": 7}, "junk", {"name": "gpu-9", "attributes": {"uuid": {"int": 9}}}]
    index = index_of(good, bad_devices, {"spec": "junk"}, "junk", {"spec": {"driver": "gpu.nvidia.com", "pool": 3}})
    assert index.get("gpu.nvidia.com", NODE, "gpu-2").uuid == "GPU-aaaa"  # type: ignore[union-attr]
    assert index.get("gpu.nvidia.com", "pool-b", "gpu-0").uuid == "GPU-bbbb"  # type: ignore[union-attr]
    assert index.get("gpu.nvidia.com", "pool-b", "gpu-9").uuid is None  # type: ignore[union-attr]


def test_a_dynamic_mig_device_without_a_uuid_is_described_but_unresolved():
    obj = nvidia_slice(NODE, (), MIGS[:1])
    del obj["spec"]["devices"][0]["attributes"]["uuid"]
    view = SliceView(SliceState.FRESH, index_of(obj))
    claim = DynamicResource("c", "ml", (ClaimDevice("gpu.nvidia.com", NODE, mig_name(MIGS[0], "v25.12"), ()),))
    (device,) = claimed_devices(claim, view, DRIVERS)
    assert device.resolution is DraResolution.NO_UUID and device.uuid is None


def claim(*devices: ClaimDevice) -> DynamicResource:
    return DynamicResource("gpu-claim", "ml", devices)


@pytest.mark.parametrize(
    ("state", "device", "resolution", "uuid"),
    [
        (SliceState.FRESH, ClaimDevice("gpu.nvidia.com", NODE, "gpu-0", ("cdi",)), DraResolution.RESOLVED, "GPU-bbbb"),
        (SliceState.STALE, ClaimDevice("gpu.nvidia.com", NODE, "gpu-0", ()), DraResolution.RESOLVED, "GPU-bbbb"),
        (SliceState.FRESH, ClaimDevice("gpu.nvidia.com", NODE, "gpu-7", ()), DraResolution.NO_SLICE, None),
        (SliceState.FRESH, ClaimDevice("gpu.nvidia.com", "node-b", "gpu-0", ()), DraResolution.NO_SLICE, None),
        (SliceState.NONE, ClaimDevice("gpu.nvidia.com", NODE, "gpu-0", ()), DraResolution.SLICES_UNAVAILABLE, None),
        (SliceState.UNUSED, ClaimDevice("gpu.nvidia.com", NODE, "gpu-0", ()), DraResolution.SLICES_UNAVAILABLE, None),
        (
            SliceState.FRESH,
            ClaimDevice("", "", "", ("k8s.gpu.nvidia.com/claim=u-gpu-0",)),
            DraResolution.NO_DEVICE_NAME,
            None,
        ),
    ],
)
def test_each_claimed_device_resolves_or_says_why(state, device, resolution, uuid):
    view = SliceView(state, index_of(nvidia_slice(NODE, GPUS)) if state is not SliceState.NONE else SliceIndex())
    (found,) = claimed_devices(claim(device), view, DRIVERS)
    assert (found.resolution, found.uuid) == (resolution, uuid)
    assert (found.claim_namespace, found.claim_name, found.cdi_devices) == ("ml", "gpu-claim", device.cdi_devices)


def test_devices_of_other_drivers_are_left_out_and_share_ids_are_kept():
    view = SliceView(SliceState.FRESH, index_of(nvidia_slice(NODE, GPUS)))
    devices = claimed_devices(
        claim(
            ClaimDevice("compute-domain.nvidia.com", NODE, "channel-0", ()),
            ClaimDevice("gpu.nvidia.com", NODE, "gpu-1", (), share_id="3f2a"),
        ),
        view,
        DRIVERS,
    )
    assert [(d.device, d.uuid, d.share_id) for d in devices] == [("gpu-1", "GPU-cccc", "3f2a")]


def test_the_note_says_what_the_slices_could_not_tell():
    assert slice_note(SliceView(SliceState.FRESH), claimed=True) is None
    assert "last good list" in (slice_note(SliceView(SliceState.STALE, last_error="HTTP 503"), claimed=False) or "")
    assert "HTTP 403" in (slice_note(SliceView(SliceState.NONE, last_error="HTTP 403"), claimed=False) or "")
    assert slice_note(SliceView(SliceState.NOT_SERVED), claimed=False) is None
    assert "v1, v1beta2, v1beta1" in (slice_note(SliceView(SliceState.NOT_SERVED), claimed=True) or "")
    assert slice_note(SliceView(SliceState.UNUSED), claimed=False) is None
    assert "--no-kubernetes" in (slice_note(SliceView(SliceState.UNUSED), claimed=True) or "")
