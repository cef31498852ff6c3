"""This node's ResourceSlices from the Kubernetes API, kept current for the DRA join (``auditor.dra``).

**Version.** Discovery of the group (``GET /apis/resource.k8s.io``: a non-resource URL that every authenticated
user may read, through the default ``system:discovery`` role) says which versions the cluster serves; the newest of
v1 (1.34+), v1beta2 and v1beta1 is read. A cluster that serves none of them has no DRA: the state is
``NOT_SERVED`` and discovery is tried again every ``rediscover_after`` seconds (an upgrade may bring it).

**List, then watch.** ``sync`` lists ``resourceslices?fieldSelector=spec.nodeName=NODE``; ``start`` keeps the list
current on a background thread with a watch from the list's ``resourceVersion`` (bookmarks on, the server ending
it after ``watch_timeout`` seconds), as an informer does, for one node. Each event updates the slices by name and
rebuilds the index: a node has a handful of slices, changed when a driver restarts or MIG is reconfigured. A watch
that ends is reopened from the last version; ``410 Gone`` (a version the server no longer keeps) relists; a failure
keeps the last good slices (``STALE``) and retries after a backoff. A cycle only reads :attr:`view`: it never waits
on the API, however slow or down the API is.

``once`` lists once and starts no thread. RBAC: ``list`` and ``watch`` on ``resourceslices`` (``resource.k8s.io``).
The ``kubernetes`` client is used through its generic ``ApiClient``, as ``auditor.kube`` does.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from .dra import API_VERSIONS, DEFAULT_GPU_DRIVERS, GROUP, SliceIndex, SliceView
from .kube import ApiError, KubeClient, api_request, describe_error, open_request
from .model import SliceState

#: Seconds a watch lasts before the server ends it (``timeoutSeconds``); the client then reopens it.
WATCH_TIMEOUT = 300
#: Beyond ``WATCH_TIMEOUT``: how long the client waits for bytes before it takes the connection for dead.
READ_MARGIN = 30.0


class _Gone(Exception):
    """The watch's resourceVersion is too old for the server (410): list again."""


class ResourceSliceCache:
    """The ResourceSlices of ``node``, for the GPU drivers ``drivers``; thread-safe to read while it watches."""

    def __init__(
        self,
        api_client: KubeClient,
        node: str,
        *,
        drivers: tuple[str, ...] = DEFAULT_GPU_DRIVERS,
        watch_timeout: int = WATCH_TIMEOUT,
        retry_min: float = 1.0,
        retry_max: float = 60.0,
        rediscover_after: float = 600.0,
    ) -> None:
        self._api_client = api_client
        self.node = node
        self.drivers = tuple(drivers)
        self.watch_timeout = watch_timeout
        self.retry_min = retry_min
        self.retry_max = retry_max
        self.rediscover_after = rediscover_after
        self._view = SliceView(SliceState.NONE)
        self._version: str | None = None  # the resource.k8s.io version served and read; None: not discovered
        self._slices: dict[str, Mapping[str, Any]] = {}
        self._resource_version: str | None = None  # where the watch resumes; None: list first
        self._listed = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None  # the open watch response, so that close() can end it
        self._thread: threading.Thread | None = None
        self.lists = 0  # successful lists
        self.watches = 0  # watches opened

    @property
    def view(self) -> SliceView:
        """The latest slices and how current they are (an immutable value, swapped whole)."""
        return self._view

    # --- one list ------------------------------------------------------------------------------------------------

    def sync(self) -> bool:
        """Discover the version when not known, then list; True when the slices are fresh. Never raises."""
        try:
            if self._version is None:
                self._version = self._discover()
                if self._version is None:
                    self._view = SliceView(SliceState.NOT_SERVED)
                    return False
            self._list()
        except Exception as error:  # any client, HTTP, socket or shape failure means "API unavailable"
            self._failed(error)
            return False
        return True

    def _discover(self) -> str | None:
        try:
            document = json.loads(api_request(self._api_client, "GET", f"/apis/{GROUP}"))
        except ApiError as error:
            if error.status == 404:
                return None  # the group is not served: no DRA in this cluster
            raise
        versions = document.get("versions") if isinstance(document, dict) else None
        if not isinstance(versions, list):
            raise ValueError(f"the discovery document of {GROUP} lists no versions")
        served = {entry.get("version") for entry in versions if isinstance(entry, dict)}
        return next((version for version in API_VERSIONS if version in served), None)

    def _path(self) -> str:
        return f"/apis/{GROUP}/{self._version}/resourceslices"

    def _selector(self) -> tuple[str, str]:
        return ("fieldSelector", f"spec.nodeName={self.node}")

    def _list(self) -> None:
        try:
            data = api_request(self._api_client, "GET", self._path(), query=[self._selector()])
        except ApiError as error:
            if error.status == 404:
                self._version = None  # the version went away (a downgrade, a switched-off API): discover again
            raise
        document = json.loads(data)
        items = document.get("items") if isinstance(document, dict) else None
        if not isinstance(items, list):
            raise ValueError("the ResourceSlice list has no items array")
        slices: dict[str, Mapping[str, Any]] = {}
        for item in items:
            name = (item.get("metadata") or {}).get("name") if isinstance(item, dict) else None
            if isinstance(name, str):
                slices[name] = item
        metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
        version = metadata.get("resourceVersion")
        with self._lock:
            self._slices = slices
            self._resource_version = version if isinstance(version, str) and version else None
            self._listed = True
            self.lists += 1
            self._publish(None)

    def _publish(self, error: str | None) -> None:
        """Rebuild the view from the slices held (under the lock); ``error`` set: the API is failing."""
        state = SliceState.FRESH if error is None else SliceState.STALE if self._listed else SliceState.NONE
        index = SliceIndex.build(self._slices.values(), self.drivers) if self._listed else SliceIndex()
        self._view = SliceView(state, index, error, self._version)

    def _failed(self, error: Exception) -> None:
        with self._lock:
            self._publish(describe_error(error))

    # --- the watch -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Keep the slices current on a daemon thread until :meth:`close`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpu-fence-resourceslices", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the watch (ending an open one at once) and wait for the thread."""
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            _end(stream)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            if self._resource_version is None:
                if not self.sync():
                    if self._view.state is SliceState.NOT_SERVED:
                        self._stop.wait(self.rediscover_after)
                    else:
                        failures += 1
                        self._stop.wait(self._backoff(failures))
                    continue
                failures = 0
            opened = time.monotonic()
            try:
                events = self._watch()
            except _Gone:
                self._resource_version = None
                continue
            except Exception as error:  # the API went away, or answered garbage: keep the last good slices
                if self._stop.is_set():
                    break
                failures += 1
                self._failed(error)
                self._stop.wait(self._backoff(failures))
                continue
            failures = 0
            if not events and time.monotonic() - opened < 1.0:
                self._stop.wait(self.retry_min)  # a server that ends watches at once must not make this spin

    def _backoff(self, failures: int) -> float:
        return min(self.retry_max, self.retry_min * 2.0 ** min(failures - 1, 32))

    def _watch(self) -> int:
        """One watch, until the server ends it; the number of events applied."""
        query = [
            self._selector(),
            ("watch", "1"),
            ("resourceVersion", str(self._resource_version)),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.watch_timeout)),
        ]
        response = open_request(
            self._api_client, "GET", self._path(), query=query, read_timeout=self.watch_timeout + READ_MARGIN
        )
        try:
            if response.status == 410:
                raise _Gone
            if not 200 <= response.status <= 299:
                raise ApiError(response.status, response.reason or "")
            with self._lock:
                if self._stop.is_set():
                    return 0
                self._stream = response
                self.watches += 1
                self._publish(None)  # the API answers again: what is held is current
            applied = 0
            for line in _lines(response.response):
                self._apply(json.loads(line))
                applied += 1
            return applied
        finally:
            with self._lock:
                self._stream = None
            _end(response)

    def _apply(self, event: Any) -> None:
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            raise ValueError("a watch event without an object")
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone
            raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or obj.get("message") or ""))
        metadata = obj.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        version, name = metadata.get("resourceVersion"), metadata.get("name")
        with self._lock:
            if kind in ("ADDED", "MODIFIED") and isinstance(name, str):
                self._slices[name] = obj
            elif kind == "DELETED" and isinstance(name, str):
                self._slices.pop(name, None)
            elif kind != "BOOKMARK":
                raise ValueError(f"a watch event of unknown type {kind!r}")
            if isinstance(version, str) and version:
                self._resource_version = version
            if kind != "BOOKMARK":
                self._publish(None)


def _lines(raw: Any) -> Iterator[bytes]:
    """The watch stream's JSON lines, each as soon as its chunk arrives (the API server flushes one per event)."""
    pending = b""
    for chunk in raw.stream(65536, decode_content=True):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending


def _end(response: Any) -> None:
    """Close a response, unblocking a thread that reads it (shutdown first: closing alone does not wake a read)."""
    raw = getattr(response, "response", None)
    for step in ("shutdown", "close"):
        try:
            getattr(raw, step)()
        except Exception:  # noqa: S112 - already closed or released: nothing left to end
            continue
