"""The ResourceSlice cache (``auditor.resourceslices``) through the real ``kubernetes`` client against the API fake
over HTTP: version negotiation, the node-scoped list, the watch and its failures, and the view a cycle reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpu_fence.auditor.kube import load_api_client
from gpu_fence.auditor.model import SliceState
from gpu_fence.auditor.resourceslices import ResourceSliceCache
from tests.fakes.kubeapi_pods_events import FakeKubeApi
from tests.fakes.kubeapi_resourceslices import DraGpu, DraMig, compute_domain_slice, nvidia_slice
from tests.fakes.polling import wait_for

NODE = "gpu-node-1"
CARD = DraGpu(0, 3, "GPU-00000000-0000-4000-8000-000000000000")
OTHER = DraGpu(1, 0, "GPU-00000001-0000-4000-8000-000000000001")
MIG = DraMig(OTHER, "MIG-00000001-0000-4000-8000-000000000010", placement_start=2)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeKubeApi]:
    fake = FakeKubeApi().start()
    fake.resource_slices.put(nvidia_slice(NODE, [CARD, OTHER], [MIG]))
    fake.resource_slices.put(compute_domain_slice(NODE))
    fake.resource_slices.put(nvidia_slice("gpu-node-2", [DraGpu(0, 0, "GPU-elsewhere")], name="elsewhere"))
    yield fake
    fake.stop()


@pytest.fixture
def cache(api: FakeKubeApi, tmp_path: Path) -> Iterator[Callable[..., ResourceSliceCache]]:
    made: list[ResourceSliceCache] = []

    def make(**options: object) -> ResourceSliceCache:
        client = load_api_client(str(api.write_kubeconfig(tmp_path / f"kubeconfig-{len(made)}")), timeout=2.0)
        options = {"retry_min": 0.05, "retry_max": 0.2, **options}
        made.append(ResourceSliceCache(client, NODE, **options))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for each in made:
        each.close()


def uuids(cache: ResourceSliceCache) -> dict[str, str | None]:
    return {key[2]: device.uuid for key, device in cache.view.index.devices.items()}


@pytest.mark.parametrize("served", [("v1", "v1beta2", "v1beta1"), ("v1beta2", "v1beta1"), ("v1beta1",)])
def test_the_newest_version_served_is_read_and_each_shape_gives_the_same_index(api, cache, served):
    api.resource_slices.served = served
    slices = cache()
    assert slices.sync()
    view = slices.view
    assert view.state is SliceState.FRESH and view.version == served[0] and view.last_error is None
    assert uuids(slices) == {
        "gpu-3": CARD.uuid,
        "gpu-0-mig-1g10gb-19-2": MIG.uuid,
    }  # by minor; the MIG-mode card is not published
    mig = view.index.get("gpu.nvidia.com", NODE, "gpu-0-mig-1g10gb-19-2")
    assert mig is not None and (mig.parent_uuid, mig.profile) == (OTHER.uuid, "1g.10gb")
    lists = [r for r in api.slice_requests() if r[1].endswith("/resourceslices")]
    assert [(path, query["fieldSelector"]) for _, path, query in lists] == [
        (f"/apis/resource.k8s.io/{served[0]}/resourceslices", [f"spec.nodeName={NODE}"])
    ]


def test_a_cluster_without_dra_is_not_served_and_never_listed(api, cache):
    api.resource_slices.served = ()
    slices = cache()
    assert not slices.sync()
    assert slices.view.state is SliceState.NOT_SERVED and slices.view.last_error is None
    assert [path for _, path, _ in api.slice_requests()] == ["/apis/resource.k8s.io"]


@pytest.mark.parametrize(
    ("break_it", "reason"),
    [
        (lambda api: setattr(api, "down", True), "HTTP 503"),
        (lambda api: setattr(api.resource_slices, "forbidden", True), "HTTP 403"),
    ],
    ids=["down", "forbidden"],
)
def test_an_api_that_never_answers_leaves_no_slices_and_says_why(api, cache, break_it, reason):
    break_it(api)
    slices = cache()
    assert not slices.sync()
    assert slices.view.state is SliceState.NONE and reason in (slices.view.last_error or "")
    assert slices.view.index.devices == {}


def test_a_failed_relist_keeps_the_last_good_slices_as_stale(api, cache):
    slices = cache()
    assert slices.sync()
    api.down = True
    assert not slices.sync()
    assert slices.view.state is SliceState.STALE and "503" in (slices.view.last_error or "")
    assert uuids(slices)["gpu-3"] == CARD.uuid
    api.down = False
    assert slices.sync() and slices.view.state is SliceState.FRESH


def test_the_watch_applies_changes_without_a_list_per_change(api, cache):
    slices = cache()
    assert slices.sync()
    slices.start()
    wait_for(lambda: api.resource_slices.watches_open == 1, "the watch to open", timeout=10, interval=0.02)
    moved = DraMig(OTHER, "MIG-00000001-0000-4000-8000-0000000000ff", placement_start=4)
    api.resource_slices.put(nvidia_slice(NODE, [CARD, OTHER], [MIG, moved], generation=2))
    wait_for(lambda: "gpu-0-mig-1g10gb-19-4" in uuids(slices), "the MODIFIED slice", timeout=10, interval=0.02)
    api.resource_slices.delete(f"{NODE}-gpu.nvidia.com-x7k2p")
    wait_for(lambda: uuids(slices) == {}, "the DELETED slice", timeout=10, interval=0.02)
    assert slices.lists == 1 and slices.view.state is SliceState.FRESH
    watches = [q for _, path, q in api.slice_requests() if q.get("watch") == ["1"]]
    assert watches[0]["resourceVersion"] == ["103"] and watches[0]["allowWatchBookmarks"] == ["true"]


def test_a_watch_the_server_ends_is_reopened_from_where_it_was(api, cache):
    slices = cache(watch_timeout=1)
    assert slices.sync()
    slices.start()
    wait_for(lambda: slices.watches >= 2, "a second watch after the server ended the first", timeout=15, interval=0.02)
    assert slices.lists == 1 and slices.view.state is SliceState.FRESH


def test_an_expired_version_relists(api, cache):
    slices = cache()
    assert slices.sync()
    api.resource_slices.put(nvidia_slice(NODE, [CARD], [], generation=2))
    api.resource_slices.compact()  # the version the list gave is gone before the watch opens
    slices.start()
    wait_for(lambda: slices.lists == 2, "the relist after 410", timeout=10, interval=0.02)
    wait_for(lambda: uuids(slices) == {"gpu-3": CARD.uuid}, "the relisted slices", timeout=10, interval=0.02)


def test_an_api_that_goes_down_mid_watch_leaves_stale_slices_then_recovers(api, cache):
    slices = cache()
    assert slices.sync()
    slices.start()
    wait_for(lambda: api.resource_slices.watches_open == 1, "the watch to open", timeout=10, interval=0.02)
    api.down = True
    wait_for(lambda: slices.view.state is SliceState.STALE, "the stale state", timeout=10, interval=0.02)
    assert uuids(slices)["gpu-3"] == CARD.uuid and "503" in (slices.view.last_error or "")
    api.down = False
    wait_for(lambda: slices.view.state is SliceState.FRESH, "recovery", timeout=10, interval=0.02)
    assert slices.view.last_error is None


def test_a_list_that_is_not_a_slice_list_is_an_error_not_a_crash(api, cache, monkeypatch):
    slices = cache()
    original = api.resource_slices.handle

    def garbage(handler, path, query, send):
        if path.endswith("/resourceslices"):
            return send(handler, 200, {"kind": "Status", "items": "not a list"})
        return original(handler, path, query, send)

    monkeypatch.setattr(api.resource_slices, "handle", garbage)
    assert not slices.sync()
    assert slices.view.state is SliceState.NONE and "items" in (slices.view.last_error or "")


def test_close_ends_an_open_watch_at_once(api, cache):
    slices = cache(watch_timeout=300)
    assert slices.sync()
    slices.start()
    wait_for(lambda: api.resource_slices.watches_open == 1, "the watch to open", timeout=10, interval=0.02)
    started = time.monotonic()
    slices.close()
    assert time.monotonic() - started < 5
    assert not any(t.name == "gpu-fence-resourceslices" for t in threading.enumerate())
