"""A local HTTP fake of the few Kubernetes API endpoints the auditor uses, for the real ``kubernetes`` client.

- ``GET /api/v1/pods?fieldSelector=spec.nodeName=NODE`` (list; with ``watch=true`` the current pods as ADDED
  events, then the stream ends, as a watch that timed out does);
- ``POST /api/v1/namespaces/NS/events`` (409 when the name exists) and
  ``PATCH /api/v1/namespaces/NS/events/NAME`` (merge, 404 when missing);
- ``/apis/resource.k8s.io``: discovery, and ResourceSlices listed and watched (``resource_slices``, a
  ``kubeapi_resourceslices.FakeResourceSlices``).

``down = True`` answers 503 to everything (an API server that is there but failing); ``forbid_events = True``
answers 403 to Event writes (RBAC without events); ``raw_pod_list`` serves those bytes as the pod list (a proxy's
HTML page, JSON of the wrong shape); ``stop()`` refuses connections. Every request is recorded in ``requests`` as
``(method, path, query)``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.http_listener import answer, answer_json
from tests.fakes.kubeapi_resourceslices import GROUP, FakeResourceSlices


def make_pod(
    namespace: str,
    name: str,
    uid: str,
    node: str,
    containers: list[tuple[str, str | None]],
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    scheduler_name: str = "default-scheduler",
    runtime: str = "containerd",
) -> dict[str, Any]:
    """A pod as the API server returns it: spec containers and statuses with ``<runtime>://<id>`` ids."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": uid,
            "labels": labels or {},
            "annotations": annotations or {},
            "resourceVersion": "1",
        },
        "spec": {
            "nodeName": node,
            "schedulerName": scheduler_name,
            "containers": [{"name": cname, "image": "example/image"} for cname, _ in containers],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": cname, "containerID": f"{runtime}://{cid}" if cid else None, "ready": True}
                for cname, cid in containers
            ],
        },
    }


class FakeKubeApi:
    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self._down = False
        #: hold every request without an answer (an API server that hangs) until ``hanging`` is cleared or the fake
        #: stops; then answer 503
        self.hanging = False
        self.hanging_events = False  # hold only Event writes (the pod list answers)
        self._unhang = threading.Event()
        self.forbid_events = False  # answer 403 to Event writes (RBAC without events create/patch)
        self.raw_pod_list: bytes | None = None  # serve these bytes as the pod list (a proxy page, broken JSON)
        self.resource_slices = FakeResourceSlices(lambda: self.down)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- state ---------------------------------------------------------------------------------------------

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, down: bool) -> None:
        self._down = down
        self.resource_slices.wake()  # an open watch ends when the API goes down

    def add_pod(self, pod: dict[str, Any], *, uid: str | None = None) -> None:
        """Serve ``pod`` in the pod list; ``uid`` files an object whose own metadata has none (a malformed pod)."""
        with self._lock:
            self.pods[uid if uid is not None else pod["metadata"]["uid"]] = pod

    def expire_events(self) -> None:
        """Forget every Event, as the API server does an hour after their last update (its default ``--event-ttl``)."""
        with self._lock:
            self.events.clear()

    def event_posts(self) -> list[tuple[str, str, dict[str, list[str]]]]:
        return [r for r in self.requests if r[0] == "POST" and "/events" in r[1]]

    def event_patches(self) -> list[tuple[str, str, dict[str, list[str]]]]:
        return [r for r in self.requests if r[0] == "PATCH" and "/events/" in r[1]]

    def pod_lists(self) -> list[tuple[str, str, dict[str, list[str]]]]:
        return [r for r in self.requests if r[0] == "GET" and r[1] == "/api/v1/pods"]

    def slice_requests(self) -> list[tuple[str, str, dict[str, list[str]]]]:
        return [r for r in self.requests if r[1].startswith(f"/apis/{GROUP}")]

    # --- serving -------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> FakeKubeApi:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

            def do_PATCH(self) -> None:
                fake._handle(self, "PATCH")

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._unhang.set()
        self.resource_slices.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def write_kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "auditor", "user": {"token": "test-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "auditor"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    # --- request handling ----------------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(handler.path)
        query = parse_qs(parts.query)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self._lock:
            self.requests.append((method, parts.path, query))
        event_write = method != "GET" and "/events" in parts.path

        def hangs() -> bool:  # read afresh while held: a test clears the flags to let the request through
            return self.hanging or (self.hanging_events and event_write)

        while hangs() and not self._unhang.wait(0.05):
            pass
        if self.down or hangs():
            return self._send(handler, 503, _status(503, "ServiceUnavailable", "the API server is down (fake)"))
        segments = [s for s in parts.path.split("/") if s]
        if method == "GET" and parts.path.startswith(f"/apis/{GROUP}"):
            return self.resource_slices.handle(handler, parts.path, query, self._send)
        if method == "GET" and parts.path == "/api/v1/pods":
            if self.raw_pod_list is not None:
                return answer(handler, 200, self.raw_pod_list)
            return self._list_pods(handler, query)
        if segments[:3] == ["api", "v1", "namespaces"] and len(segments) >= 5 and segments[4] == "events":
            namespace = segments[3]
            if self.forbid_events:
                message = f'events is forbidden: User "system:serviceaccount:gpu-fence:auditor" cannot {method} events'
                return self._send(handler, 403, _status(403, "Forbidden", message))
            try:
                document = json.loads(body or b"{}")
            except ValueError:
                return self._send(handler, 400, _status(400, "BadRequest", "body is not JSON"))
            if method == "POST" and len(segments) == 5:
                return self._create_event(handler, namespace, document)
            if method == "PATCH" and len(segments) == 6:
                return self._patch_event(handler, namespace, segments[5], document)
        return self._send(handler, 404, _status(404, "NotFound", f"{method} {parts.path} is not faked"))

    def _list_pods(self, handler: BaseHTTPRequestHandler, query: dict[str, list[str]]) -> None:
        selector = query.get("fieldSelector", [""])[0]
        node = selector.removeprefix("spec.nodeName=") if selector.startswith("spec.nodeName=") else None
        with self._lock:
            pods = [p for p in self.pods.values() if node is None or p["spec"].get("nodeName") == node]
        if query.get("watch", ["false"])[0] in ("true", "1"):
            lines = b"".join(json.dumps({"type": "ADDED", "object": p}).encode() + b"\n" for p in pods)
            return answer(handler, 200, lines)
        body = {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"}, "items": pods}
        return self._send(handler, 200, body)

    def _create_event(self, handler: BaseHTTPRequestHandler, namespace: str, event: dict[str, Any]) -> None:
        name = event.get("metadata", {}).get("name", "")
        if not name or event.get("involvedObject", {}).get("kind") != "Pod":
            return self._send(handler, 422, _status(422, "Invalid", "an Event needs metadata.name and a Pod object"))
        with self._lock:
            if (namespace, name) in self.events:
                return self._send(handler, 409, _status(409, "AlreadyExists", f"events {name!r} already exists"))
            self.events[(namespace, name)] = event
        return self._send(handler, 201, event)

    def _patch_event(self, handler: BaseHTTPRequestHandler, namespace: str, name: str, patch: dict[str, Any]) -> None:
        with self._lock:
            event = self.events.get((namespace, name))
            if event is None:
                return self._send(handler, 404, _status(404, "NotFound", f"events {name!r} not found"))
            event.update(patch)
        return self._send(handler, 200, event)

    def _send(self, handler: BaseHTTPRequestHandler, code: int, body: dict[str, Any]) -> None:
        answer_json(handler, code, body)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
