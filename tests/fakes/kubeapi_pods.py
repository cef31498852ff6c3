"""A local HTTP fake of the pod-list endpoints that ``gpu-fence-webhook check --cluster`` uses.

Serves, to the real ``kubernetes`` client:

- ``GET /api/v1/pods`` (every namespace) and ``GET /api/v1/namespaces/NS/pods``, honouring ``limit`` and
  ``continue`` the way the API server pages a list (the continue token is opaque to the client);
- anything else: a 404 ``Status``.

``fail_with = (code, message)`` answers every request with that ``Status`` (403 for missing RBAC, say);
``garbage = True`` answers 200 with a body that is not JSON. Every request is recorded in ``requests`` as
``(path, query)``. Use as a context manager; ``url`` is ``http://127.0.0.1:PORT``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.http_listener import answer


def pod(namespace: str, name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A pod as the API server lists it: items of a PodList carry no ``kind``/``apiVersion`` of their own."""
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{namespace}-{name}", "resourceVersion": "7"},
        "spec": {"containers": containers, **spec},
        "status": {"phase": "Running"},
    }


def write_kubeconfig(path: Path, server: str, *, namespace: str = "default") -> Path:
    """A kubeconfig with one plain-HTTP cluster and a token user, as ``kubectl`` would read it."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {"token": "test-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


class FakePodsApi:
    def __init__(self, pods: list[dict[str, Any]] | None = None) -> None:
        self.pods: list[dict[str, Any]] = list(pods or [])
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self.fail_with: tuple[int, str] | None = None
        self.garbage = False
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakePodsApi:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                fake.requests.append((parts.path, query))
                code, body = fake.answer(parts.path, query)
                answer(self, code, body if isinstance(body, bytes) else json.dumps(body).encode())

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        if self.fail_with is not None:
            code, message = self.fail_with
            return code, _status(code, message)
        if self.garbage:
            return 200, b"<html>not the API server</html>"
        segments = path.strip("/").split("/")
        if segments == ["api", "v1", "pods"]:
            selected = self.pods
        elif len(segments) == 5 and segments[:3] == ["api", "v1", "namespaces"] and segments[4] == "pods":
            selected = [p for p in self.pods if p["metadata"].get("namespace") == segments[3]]
        else:
            return 404, _status(404, f"the server could not find the requested resource ({path})")
        start = int(query.get("continue", ["0"])[0] or 0)
        limit = int(query.get("limit", ["0"])[0] or 0) or len(selected) or 1
        page = selected[start : start + limit]
        metadata: dict[str, Any] = {"resourceVersion": "42"}
        if start + limit < len(selected):
            metadata["continue"] = str(start + limit)
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": page}


def _status(code: int, message: str) -> dict[str, Any]:
    reasons = {403: "Forbidden", 404: "NotFound", 500: "InternalError", 503: "ServiceUnavailable"}
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reasons.get(code, "Unknown"),
        "code": code,
    }
