"""Pod identity and Events through the real ``kubernetes`` client against the local API fake."""

from __future__ import annotations

import threading

import pytest

from gpu_fence.auditor.kube import (
    ApiBudget,
    ApiBudgetSpent,
    ApiError,
    EventRecorder,
    KubernetesUnavailable,
    PodCache,
    api_request,
    load_api_client,
)
from gpu_fence.auditor.model import ContainerRef, Finding, FindingKind, IdentitySource
from gpu_fence.auditor.pods import container_names_by_id
from tests.fakes.kubeapi_pods_events import FakeKubeApi, make_pod

CID = "a" * 64


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class HeaderRecordingApi(FakeKubeApi):
    """The API fake, also keeping each request's headers: the auditor builds its requests itself, so what a real
    API server checks (bearer token, a patch content type it accepts) is asserted here."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[tuple[str, str, dict[str, str]]] = []

    def _handle(self, handler, method):
        names = {name.lower(): value for name, value in handler.headers.items()}  # HTTP header names ignore case
        self.headers.append((method, handler.path.split("?", 1)[0], names))
        return super()._handle(handler, method)


@pytest.fixture
def api(tmp_path):
    fake = HeaderRecordingApi().start()
    fake.add_pod(make_pod("ml", "train", "uid-1", "node-a", [("main", CID)], labels={"team": "vision"}))
    fake.add_pod(make_pod("ml", "elsewhere", "uid-2", "node-b", [("main", "b" * 64)]))
    yield fake, load_api_client(str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
    fake.stop()


def test_pod_cache_lists_only_this_node_with_a_field_selector(api):
    fake, client = api
    cache = PodCache(client, "node-a")
    assert cache.refresh() and cache.state is IdentitySource.KUBERNETES
    assert set(cache.pods) == {"uid-1"}
    assert fake.pod_lists()[0][2]["fieldSelector"] == ["spec.nodeName=node-a"]
    assert container_names_by_id(cache.pods["uid-1"]) == {CID: "main"}


def test_pod_cache_relists_when_due_or_for_an_unknown_uid_but_rate_limited(api):
    fake, client = api
    clock = Clock()
    cache = PodCache(client, "node-a", relist_interval=60, min_relist_interval=5, clock=clock)
    cache.ensure(["uid-1"])
    cache.ensure(["uid-1"])
    assert len(fake.pod_lists()) == 1  # cached
    fake.add_pod(make_pod("ml", "new", "uid-3", "node-a", [("main", "c" * 64)]))
    cache.ensure(["uid-3"])
    assert len(fake.pod_lists()) == 1  # unknown uid, but within the minimum interval
    clock.now += 5
    cache.ensure(["uid-3"])
    assert len(fake.pod_lists()) == 2 and "uid-3" in cache.pods
    clock.now += 60
    cache.ensure([])
    assert len(fake.pod_lists()) == 3  # periodic relist


def test_pod_cache_keeps_the_last_list_while_the_api_is_down(api):
    fake, client = api
    clock = Clock()
    cache = PodCache(client, "node-a", min_relist_interval=1, clock=clock)
    cache.refresh()
    fake.down = True
    clock.now += 100
    assert not cache.refresh()
    assert cache.state is IdentitySource.KUBERNETES_STALE and "503" in cache.last_error and "uid-1" in cache.pods
    fake.down = False
    clock.now += 1
    assert cache.refresh() and cache.state is IdentitySource.KUBERNETES


def test_pod_cache_skips_malformed_pods_instead_of_failing_every_cycle(api):
    """One pod the cache cannot read (a status that is not an object) must not take the whole node's identity
    down: refresh never raises, the other pods stay named."""
    fake, client = api
    junk = make_pod("ml", "junk", "uid-junk", "node-a", [("main", "d" * 64)])
    junk["status"] = ["not", "an", "object"]
    odd = make_pod("ml", "odd", "uid-odd", "node-a", [("main", "e" * 64)])
    odd["metadata"]["labels"] = ["not-a-map"]
    fake.add_pod(junk)
    fake.add_pod(odd)
    fake.add_pod({"metadata": "not-an-object", "spec": {"nodeName": "node-a"}}, uid="uid-meta")
    cache = PodCache(client, "node-a")
    assert cache.refresh() and cache.state is IdentitySource.KUBERNETES
    assert set(cache.pods) == {"uid-1", "uid-junk", "uid-odd"}  # a pod without readable metadata is left out
    assert container_names_by_id(cache.pods["uid-junk"]) == {}
    assert container_names_by_id(cache.pods["uid-odd"]) == {"e" * 64: "main"}


def test_pod_cache_treats_a_pod_list_that_is_not_json_as_the_api_being_down(api):
    fake, client = api
    clock = Clock()
    cache = PodCache(client, "node-a", min_relist_interval=1, clock=clock)
    assert cache.refresh()
    fake.raw_pod_list = b"<html>proxy error</html>"
    clock.now += 100
    assert not cache.refresh()
    assert cache.state is IdentitySource.KUBERNETES_STALE and cache.last_error and "uid-1" in cache.pods
    fake.raw_pod_list = b'{"items": {"not": "a list"}}'
    clock.now += 100
    assert not cache.refresh() and "uid-1" in cache.pods


def test_pod_cache_that_never_reached_the_api_is_unavailable(tmp_path):
    fake = FakeKubeApi().start()
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig")
    fake.stop()  # nothing listens on that port any more
    cache = PodCache(load_api_client(str(kubeconfig), budget=ApiBudget(per_call=2)), "node-a")
    assert not cache.refresh()
    assert cache.state is IdentitySource.FALLBACK and cache.pods == {} and cache.last_error


def test_load_api_client_names_what_to_fix(tmp_path):
    with pytest.raises(KubernetesUnavailable, match="--kubeconfig FILE"):
        load_api_client(str(tmp_path / "missing"))


def finding(kind=FindingKind.USED_UNALLOCATED, gpu="GPU-1", pid=1, pod="train"):
    return Finding(kind, ContainerRef("ml", pod, "main", f"uid-{pod}"), gpu, pid=pid, memory_bytes=1, message="m")


def test_events_are_deduplicated_and_re_emitted_by_patch_after_the_interval(api):
    fake, client = api
    clock = Clock()
    recorder = EventRecorder(client, "node-a", reemit_after=600, clock=clock)
    assert recorder.record([finding(pid=1), finding(pid=2), finding(gpu="GPU-2")]) == 2
    assert recorder.record([finding(pid=3)]) == 0
    assert len(fake.event_posts()) == 2 and not fake.event_patches()
    event = next(iter(fake.events.values()))
    assert event["reason"] == "GPUOverreach" and event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == "uid-train" and event["source"]["host"] == "node-a"
    clock.now += 600
    assert recorder.record([finding(pid=4)]) == 1
    assert len(fake.event_patches()) == 1
    assert max(e["count"] for e in fake.events.values()) == 2


def test_unattributed_findings_get_no_event_and_a_down_api_is_retried_next_cycle(api):
    fake, client = api
    recorder = EventRecorder(client, "node-a")
    host = Finding(FindingKind.UNATTRIBUTED_PROCESS, ContainerRef(None, None, None), "GPU-1", pid=5, message="host")
    fake.down = True
    assert recorder.record([host, finding()]) == 0
    assert recorder.failures == 1 and "503" in recorder.last_error
    fake.down = False
    assert recorder.record([host, finding()]) == 1
    assert len(fake.events) == 1


def test_forbidden_events_are_counted_and_never_raise(api):
    """RBAC without events/create: each cycle tries once (no burst of 403s), counts it, and keeps auditing."""
    fake, client = api
    fake.forbid_events = True
    recorder = EventRecorder(client, "node-a")
    assert recorder.record([finding(pod="p1"), finding(pod="p2")]) == 0
    assert recorder.failures == 1 and "403" in recorder.last_error
    assert len(fake.event_posts()) == 1
    fake.forbid_events = False
    assert recorder.record([finding(pod="p1"), finding(pod="p2")]) == 2


def test_event_cache_is_bounded_and_an_existing_event_is_not_duplicated(api):
    fake, client = api
    recorder = EventRecorder(client, "node-a", max_entries=3, max_per_cycle=100)
    assert recorder.record([finding(pod=f"p{i}") for i in range(10)]) == 10
    assert len(fake.events) == 10
    # It remembers the last three: those are not due again; one it forgot is posted again, and the API's 409
    # keeps the Event single.
    assert recorder.record([finding(pod=f"p{i}") for i in (7, 8, 9)]) == 0
    assert recorder.record([finding(pod="p6")]) == 1
    assert len(fake.events) == 10
    again = EventRecorder(client, "node-a")  # a restarted auditor: the API answers 409, no second Event
    assert again.record([finding(pod="p0")]) == 1
    assert len(fake.events) == 10


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ("initContainers", "spec.initContainers{main}"),
        ("ephemeralContainers", "spec.ephemeralContainers{main}"),
        ("containers", "spec.containers{main}"),
        (None, "spec.containers{main}"),
    ],
)
def test_event_points_at_the_containers_own_spec_list(api, field, path):
    """kubectl describe and the UI resolve fieldPath against the pod spec: an init or ephemeral container is not
    in spec.containers."""
    fake, client = api
    overreach = Finding(
        FindingKind.VISIBLE_UNALLOCATED,
        ContainerRef("ml", "train", "main", "uid-train"),
        "GPU-1",
        message="m",
        container_field=field,
    )
    assert EventRecorder(client, "node-a").record([overreach]) == 1
    (event,) = fake.events.values()
    assert event["involvedObject"]["fieldPath"] == path


def test_audit_findings_carry_the_containers_spec_list():
    from gpu_fence.auditor.audit import audit
    from gpu_fence.auditor.model import Container, Gpu, NodeSnapshot

    debugger = Container(
        "ml", "train", "debug", "uid-1", "c9", visible=frozenset({"GPU-1"}), spec_field="ephemeralContainers"
    )
    snapshot = NodeSnapshot("n", 0.0, (Gpu("GPU-1", 0, 0),), (debugger,), ())
    (found,) = audit(snapshot).findings
    assert found.container_field == "ephemeralContainers"


def test_requests_carry_the_token_and_the_content_types_the_api_server_accepts(api):
    fake, client = api
    clock = Clock()
    PodCache(client, "node-a").refresh()
    recorder = EventRecorder(client, "node-a", reemit_after=60, clock=clock)
    recorder.record([finding()])
    clock.now += 60
    recorder.record([finding()])
    (listed, posted, patched) = fake.headers
    assert [(method, path) for method, path, _ in fake.headers] == [
        ("GET", "/api/v1/pods"),
        ("POST", "/api/v1/namespaces/ml/events"),
        ("PATCH", f"/api/v1/namespaces/ml/events/{next(iter(fake.events))[1]}"),
    ]
    assert all(headers["authorization"] == "Bearer test-token" for _, _, headers in fake.headers)
    assert all(headers["accept"] == "application/json" for _, _, headers in fake.headers)
    assert "content-type" not in listed[2]
    assert posted[2]["content-type"] == "application/json"
    assert patched[2]["content-type"] == "application/merge-patch+json"


def test_an_expired_event_is_posted_again_with_its_count(api):
    """The API server drops Events after an hour by default: the patch then answers 404 and the auditor posts the
    Event again under the same name, keeping its count."""
    fake, client = api
    clock = Clock()
    recorder = EventRecorder(client, "node-a", reemit_after=600, clock=clock)
    assert recorder.record([finding()]) == 1
    fake.expire_events()
    clock.now += 600
    assert recorder.record([finding()]) == 1
    assert len(fake.event_patches()) == 1 and len(fake.event_posts()) == 2
    (event,) = fake.events.values()
    assert event["count"] == 2 and recorder.failures == 0


def test_api_request_names_the_status_and_encodes_path_parameters(api):
    fake, client = api
    with pytest.raises(ApiError, match="HTTP 404") as raised:
        api_request(
            client,
            "PATCH",
            "/api/v1/namespaces/{namespace}/events/{name}",
            path_params={"namespace": "ml", "name": "a/b c"},
            body={"count": 1},
            content_type="application/merge-patch+json",
        )
    assert raised.value.status == 404
    assert fake.headers[-1][1] == "/api/v1/namespaces/ml/events/a%2Fb%20c"  # one path segment, not two


def test_an_api_budget_bounds_each_call_and_all_of_a_cycles_calls_together():
    budget = ApiBudget(per_call=10)
    assert budget.timeout() == 10  # no cycle budget (once): the per-call bound
    budget.renew(4)
    assert budget.timeout() == 4
    budget.spend(3.5)
    assert budget.timeout() == pytest.approx(0.5)
    budget.spend(0.5)
    with pytest.raises(ApiBudgetSpent):
        budget.timeout()
    budget.renew(None)
    assert budget.timeout() == 10


def test_a_spent_budget_fails_api_calls_at_once_and_each_call_spends_what_it_took(api):
    fake, client = api
    client.budget.renew(0)
    cache = PodCache(client, "node-a", min_relist_interval=0)
    assert not cache.refresh() and "ApiBudgetSpent" in cache.last_error
    assert fake.pod_lists() == []  # nothing was sent
    client.budget.renew(5)  # the next cycle's budget
    assert cache.refresh() and cache.last_error is None and len(fake.pod_lists()) == 1
    assert 0 < client.budget.timeout() < 5


def test_the_cycles_budget_binds_its_own_thread_not_the_resourceslice_watchs(api):
    """The watch shares the client from its own thread: a spent cycle budget must not fail its requests, and its long
    reads must not be charged to the cycle."""
    _fake, client = api
    client.budget.renew(0)  # this thread's cycle has no time left
    with pytest.raises(ApiBudgetSpent):
        api_request(client, "GET", "/api/v1/pods")
    answers: list[bytes | BaseException] = []

    def watch_thread() -> None:
        try:
            answers.append(api_request(client, "GET", "/api/v1/pods"))
        except BaseException as error:  # handed to the test thread, which asserts on it
            answers.append(error)

    thread = threading.Thread(target=watch_thread)
    thread.start()
    thread.join(timeout=30)
    assert len(answers) == 1 and isinstance(answers[0], bytes), answers
    client.budget.renew(5)
    assert client.budget.timeout() == 5  # the other thread spent nothing of it
