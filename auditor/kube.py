"""Pod identity from the Kubernetes API, and ``Warning GPUOverreach`` Events on offending pods.

Identity: one node-scoped pod list (``fieldSelector=spec.nodeName=NODE``), cached, relisted every
``relist_interval`` seconds and early (at most every ``min_relist_interval``) when a cycle meets a pod uid the
cache does not know, so a new pod is named within one cycle without a watch connection per node. Pods stay plain
dicts, as the API returned them. When the API is unreachable the last list is kept (state ``KUBERNETES_STALE``);
when it has never answered the state is ``FALLBACK``: the snapshot names containers from other sources.

Events: one Event per distinct finding (namespace, pod uid, container, kind, GPU), re-emitted (count + 1,
``lastTimestamp``) at most every ``reemit_after`` seconds, remembered in a bounded LRU so memory stays flat
however many pods come and go.

The ``kubernetes`` client is imported inside functions: ``--help`` and ``--no-kubernetes`` never load it. Requests
go through its generic ``ApiClient`` (configuration, credentials, TLS, connection pool) and never through
``CoreV1Api``: that class's first use imports every API and model module of the package (~250 modules, +22 MB of
RSS on a dense node), and the auditor reads and writes plain JSON anyway.
"""

# ruff: noqa: PLC0415  (the kubernetes client is imported lazily on purpose, see the module docstring)
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpu_fence.kubeconfig import KubeConfigError, load_configuration

from .model import Finding, IdentitySource
from .pods import container_names_by_id

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
EVENT_REASON = "GPUOverreach"
COMPONENT = "gpu-fence-auditor"
EVENTS_PATH = "/api/v1/namespaces/{namespace}/events"
#: (namespace, pod uid or name, container, finding kind, GPU): one Event each. Its repr names the Event, so that an
#: auditor that restarts finds the Events it posted before.
EventKey = tuple[str | None, str | None, str | None, str, str | None]


class KubernetesUnavailable(Exception):
    """The API could not be configured or reached; ``reason`` is one line naming what to fix."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: The longest any one API call may wait, cycle or not (what the client's timeout was before cycles bounded it).
API_CALL_SECONDS = 10.0


class ApiBudgetSpent(Exception):
    """The current cycle has no time left for API calls; the next cycle tries again."""


class ApiBudget:
    """How long API calls may still wait: each at most ``per_call`` seconds and, once :meth:`renew` for a cycle,
    all of that cycle's calls together (the pod list, the Events) no longer than its budget, so that an API server
    that hangs costs a cycle a bounded time: it is waited for once, then later calls fail at once.

    The budget counts time spent in calls, not time since the cycle began: reading the kubelet, NVML and /proc
    first does not use it up. It binds the calls of the thread that renews it, the cycle's: the ResourceSlice
    watch shares the client from its own thread, and its long reads are neither cut short by a cycle's budget nor
    charged to it.
    """

    def __init__(self, per_call: float = API_CALL_SECONDS) -> None:
        self.per_call = per_call
        self._left: float | None = None
        self._thread: int | None = None  # the thread whose calls the budget binds

    def renew(self, seconds: float | None) -> None:
        """Give the calls of this thread from now on ``seconds`` in all (None: no budget, only the per-call
        bound)."""
        self._left = seconds
        self._thread = threading.get_ident()

    def applies(self) -> bool:
        """Whether this thread's calls draw on a budget (renewed, and by this thread)."""
        return self._left is not None and self._thread == threading.get_ident()

    def timeout(self) -> float:
        """The seconds the next call may wait in all; raises ``ApiBudgetSpent`` when none are left."""
        if self._left is None:
            return self.per_call
        if self._left <= 0:
            raise ApiBudgetSpent("no time left in this cycle for Kubernetes API calls")
        return min(self.per_call, self._left)

    def spend(self, seconds: float) -> None:
        if self._left is not None:
            self._left -= seconds


@dataclass(frozen=True)
class KubeClient:
    """What every request of the auditor goes through: the ``kubernetes`` client's ``ApiClient`` (configuration,
    credentials, TLS, connection pool; used through ``param_serialize`` and ``call_api`` alone) and the budget its
    calls wait within."""

    api: Any
    budget: ApiBudget


def load_api_client(
    kubeconfig: str | None, *, timeout: float = API_CALL_SECONDS, budget: ApiBudget | None = None
) -> KubeClient:
    """An ``ApiClient`` configured as ``gpu_fence.kubeconfig`` finds it, failing fast (no retries); its calls wait
    as ``budget`` allows (by default at most ``timeout`` seconds each)."""
    from kubernetes import client

    try:
        configuration = load_configuration(kubeconfig)
    except KubeConfigError as error:
        where = error.source if error.in_cluster else f"kubeconfig {error.source}"
        raise KubernetesUnavailable(
            f"cannot configure the Kubernetes client from {where}: {error.reason} "
            "(pass --kubeconfig FILE, run in a pod, or use --no-kubernetes)"
        ) from error
    configuration.retries = 0  # a cycle must not stall on an API that is down: the next cycle retries
    return KubeClient(client.ApiClient(configuration), budget if budget is not None else ApiBudget(per_call=timeout))


class ApiError(Exception):
    """The API server answered with a status outside 2xx; ``status`` and ``reason`` are its HTTP status line."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status = status
        self.reason = reason


def api_request(api_client: KubeClient, method: str, path: str, **options: Any) -> bytes:
    """One request (``options`` as :func:`open_request` takes them); the response body, read whole. Raises
    ``ApiError`` on a non-2xx status and ``ApiBudgetSpent`` when the cycle has no time left for it; socket, TLS and
    timeout errors pass through as the client raises them. On the cycle's thread the call waits at most what the
    client's ``ApiBudget`` allows, in all (urllib3's total timeout: connecting and reading together), and spends
    from it what it took, the body's reading included."""
    budget = _cycle_budget(api_client)
    started = time.monotonic()
    try:
        response = open_request(api_client, method, path, **options)
        data: bytes = response.read()
    finally:
        if budget is not None:
            budget.spend(time.monotonic() - started)
    if not 200 <= response.status <= 299:
        raise ApiError(response.status, response.reason or "")
    return data


def open_request(
    api_client: KubeClient,
    method: str,
    path: str,
    *,
    path_params: Mapping[str, str] | None = None,
    query: list[tuple[str, str]] | None = None,
    body: Mapping[str, Any] | None = None,
    content_type: str = "application/json",
    read_timeout: float | None = None,
) -> Any:
    """One request through the client's configuration (server, bearer token, client certificates, CA) and its
    connection pool, its response not read yet (``.status``; ``.response`` streams the body, as a watch needs).

    ``path`` may hold ``{name}`` placeholders filled from ``path_params`` (percent-encoded by the client).
    On the thread that renews the client's ``ApiBudget`` (the audit cycle) the request waits at most what the
    budget has left, in all; elsewhere (the ResourceSlice watch) it connects within the per-call bound and waits
    ``read_timeout`` (default: that bound) for the next bytes, spending nothing of the cycle's time.
    """
    per_call = api_client.budget.per_call
    cycle = _cycle_budget(api_client)
    waits = (per_call, per_call if read_timeout is None else read_timeout)  # connect, then each read
    timeout = cycle.timeout() if cycle is not None else waits
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    method, url, headers, serialized, _ = api_client.api.param_serialize(
        method,
        path,
        path_params=dict(path_params) if path_params else None,
        query_params=query,
        header_params=headers,
        body=dict(body) if body is not None else None,
        auth_settings=["BearerToken"],  # the only scheme the client knows; it re-reads a rotated in-cluster token
    )
    return api_client.api.call_api(method, url, header_params=headers, body=serialized, _request_timeout=timeout)


def _cycle_budget(api_client: KubeClient) -> ApiBudget | None:
    """The client's budget when this thread's calls draw on it (see ``ApiBudget``), else None."""
    return api_client.budget if api_client.budget.applies() else None


def describe_error(error: Exception) -> str:
    """An API failure in one line: its HTTP status, or the exception's type and first line."""
    status = getattr(error, "status", None)
    if status:
        return f"HTTP {status} {getattr(error, 'reason', '')}".strip()
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


class PodCache:
    """The pods of one node, by uid, from a cached node-scoped list."""

    def __init__(
        self,
        api_client: KubeClient,
        node: str,
        *,
        relist_interval: float = 60.0,
        min_relist_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api_client = api_client
        self.node = node
        self.relist_interval = relist_interval
        self.min_relist_interval = min_relist_interval
        self._clock = clock
        self.pods: dict[str, dict[str, Any]] = {}
        self.last_error: str | None = None
        self.lists = 0
        self._listed_at: float | None = None  # last successful list
        self._tried_at: float | None = None  # last attempt
        self._known_uids: set[str] = set()
        self._known_containers: set[str] = set()

    @property
    def state(self) -> IdentitySource:
        """The names this cache gives: a fresh list, the last one while the API fails, or none (it never answered)."""
        if self._listed_at is None:
            return IdentitySource.FALLBACK
        return IdentitySource.KUBERNETES_STALE if self.last_error else IdentitySource.KUBERNETES

    def refresh(self, *, force: bool = False) -> bool:
        """Relist when due (or forced); True when the cache is fresh after the call. Never raises.

        Attempts are spaced by ``min_relist_interval`` whatever asks for them, so a down API server or a burst
        of unknown pods costs at most one request per interval.
        """
        now = self._clock()
        if self._tried_at is not None and now - self._tried_at < self.min_relist_interval:
            return self._listed_at is not None and self.last_error is None
        due = self._listed_at is None or self.last_error is not None or now - self._listed_at >= self.relist_interval
        if not (force or due):
            return True
        self._tried_at = now
        try:
            self.pods = self._list()
        except Exception as error:  # any client, HTTP or socket failure means "API unavailable"
            self.last_error = describe_error(error)
            return False
        self.last_error = None
        self._listed_at = now
        self._known_uids = set(self.pods)
        self._known_containers = set()
        for pod in self.pods.values():
            mirror = ((pod.get("metadata") or {}).get("annotations") or {}).get(MIRROR_ANNOTATION)
            if isinstance(mirror, str):
                self._known_uids.add(mirror)  # a static pod's cgroup carries its config hash, not the mirror's uid
            self._known_containers.update(container_names_by_id(pod))
        return True

    def ensure(self, pod_uids: Iterable[str], container_ids: Iterable[str] = ()) -> None:
        """Refresh when due, or early when a cycle meets a pod uid or a GPU process's container id that the cache
        has never seen (a new pod, a restarted container)."""
        unknown = any(uid not in self._known_uids for uid in pod_uids) or any(
            cid not in self._known_containers for cid in container_ids
        )
        self.refresh(force=unknown)

    def _list(self) -> dict[str, dict[str, Any]]:
        selector = [("fieldSelector", f"spec.nodeName={self.node}")]
        data = api_request(self._api_client, "GET", "/api/v1/pods", query=selector)
        document = json.loads(data)
        self.lists += 1
        items = document.get("items") if isinstance(document, dict) else None
        if not isinstance(items, list):
            raise ValueError("the pod list has no items array")
        pods: dict[str, dict[str, Any]] = {}
        for pod in items:
            # One pod we cannot read must not cost the node its identity: keep only objects with a uid.
            metadata = pod.get("metadata") if isinstance(pod, dict) else None
            uid = metadata.get("uid") if isinstance(metadata, dict) else None
            if isinstance(uid, str):
                pods[uid] = pod
        return pods


# --- Events ------------------------------------------------------------------------------------------------


def _now_rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _field_path(finding: Finding) -> str | None:
    """Where in the pod the finding points. Without the pod list (fallback identity) the container's list is
    unknown; ``spec.containers`` is then the likeliest, as PodResources lists regular containers and sidecars."""
    if not finding.ref.container:
        return None
    return f"spec.{finding.container_field or 'containers'}{{{finding.ref.container}}}"


class EventRecorder:
    """Posts deduplicated ``Warning GPUOverreach`` Events on the pods that findings name."""

    def __init__(
        self,
        api_client: KubeClient,
        node: str,
        *,
        reemit_after: float = 3600.0,
        max_entries: int = 4096,
        max_per_cycle: int = 50,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api_client = api_client
        self.node = node
        self.reemit_after = reemit_after
        self.max_entries = max_entries
        self.max_per_cycle = max_per_cycle
        self._clock = clock
        self._seen: OrderedDict[EventKey, tuple[str, float, int]] = OrderedDict()  # key → (event name, time, count)
        self.failures = 0
        self.last_error: str | None = None

    @staticmethod
    def finding_key(finding: Finding) -> EventKey:
        """What makes two findings 'the same' for Events: the pid is left out (processes restart)."""
        ref = finding.ref
        return (ref.namespace, ref.pod_uid or ref.pod, ref.container, finding.kind.value, finding.gpu)

    def record(self, findings: Iterable[Finding]) -> int:
        """Emit what is new or due; returns the number of API writes made. Never raises."""
        writes = 0
        now = self._clock()
        for finding in findings:
            if finding.ref.namespace is None or finding.ref.pod is None:
                continue  # unattributed processes have no pod to put an Event on
            if writes >= self.max_per_cycle:
                break
            key = self.finding_key(finding)
            previous = self._seen.get(key)
            if previous is not None:
                self._seen.move_to_end(key)
                if now - previous[1] < self.reemit_after:
                    continue
            try:
                if previous is None:
                    name = self._create(finding, key, now)
                    self._remember(key, (name, now, 1))
                else:
                    name, _, count = previous
                    self._bump(finding, name, count + 1, now, key)
                    self._remember(key, (name, now, count + 1))
            except Exception as error:  # the API may be down; the next cycle retries
                self.failures += 1
                self.last_error = describe_error(error)
                break
            writes += 1
        return writes

    def _remember(self, key: EventKey, value: tuple[str, float, int]) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)

    def _event_name(self, finding: Finding, key: EventKey) -> str:
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
        return f"{(finding.ref.pod or 'pod')[:200]}.gpu-fence-{digest}"

    def _body(self, finding: Finding, name: str, now: float, count: int) -> dict[str, Any]:
        stamp = _now_rfc3339(now)
        ref = finding.ref
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": ref.namespace,
                "name": ref.pod,
                "uid": ref.pod_uid,
                "fieldPath": _field_path(finding),
            },
            "reason": EVENT_REASON,
            "type": "Warning",
            "message": f"{finding.kind.value}: {finding.message}"[:1024],
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": count,
        }

    def _post(self, finding: Finding, name: str, now: float, count: int) -> None:
        api_request(
            self._api_client,
            "POST",
            EVENTS_PATH,
            path_params={"namespace": str(finding.ref.namespace)},
            body=self._body(finding, name, now, count),
        )

    def _create(self, finding: Finding, key: EventKey, now: float) -> str:
        name = self._event_name(finding, key)
        try:
            self._post(finding, name, now, 1)
        except ApiError as error:
            if error.status != 409:  # 409: posted by an earlier run of the auditor; keep it, do not duplicate
                raise
        return name

    def _bump(self, finding: Finding, name: str, count: int, now: float, key: EventKey) -> None:
        message = f"{finding.kind.value}: {finding.message}"[:1024]
        patch = {"count": count, "lastTimestamp": _now_rfc3339(now), "message": message}
        try:
            api_request(
                self._api_client,
                "PATCH",
                EVENTS_PATH + "/{name}",
                path_params={"namespace": str(finding.ref.namespace), "name": name},
                body=patch,
                content_type="application/merge-patch+json",
            )
        except ApiError as error:
            if error.status != 404:
                raise
            # The Event expired (the API server keeps them an hour by default): post it again.
            self._post(finding, name, now, count)
