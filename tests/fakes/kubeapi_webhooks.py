"""A small local HTTP fake of the Kubernetes API endpoints that ``gpu-fence-webhook certs --secret`` uses.

Speaks enough of the real API for the real ``kubernetes`` client: Secrets (get/create/replace, with
resourceVersion conflicts and the kubernetes.io/tls key check) and admission webhook configurations (get, and
JSON Patch applied with ``jsonpatch``, ``test`` operations included). Every request is recorded, so tests can
assert the order of writes and that a re-run writes nothing.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import jsonpatch

from tests.fakes.http_listener import Listener, answer_json

_SECRET = re.compile(r"^/api/v1/namespaces/([^/]+)/secrets(?:/([^/?]+))?$")
_WEBHOOKS = re.compile(r"^/apis/admissionregistration\.k8s\.io/v1/(mutating|validating)webhookconfigurations/([^/?]+)$")


@dataclass
class FakeKubeApi:
    secrets: dict[tuple[str, str], dict] = field(default_factory=dict)
    webhooks: dict[tuple[str, str], dict] = field(default_factory=dict)  # (kind, name) -> configuration
    log: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    #: (method, path regex) -> HTTP status to answer instead, to test error handling
    failures: dict[tuple[str, str], int] = field(default_factory=dict)
    version: int = 100
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_webhooks(self, kind: str, name: str, hook_names: list[str]) -> None:
        self.webhooks[(kind, name)] = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": f"{kind.capitalize()}WebhookConfiguration",
            "metadata": {"name": name, "resourceVersion": self._next()},
            "webhooks": [
                {
                    "name": hook,
                    "clientConfig": {
                        "service": {"name": "gpu-fence-webhook", "namespace": "gpu-fence", "path": "/validate"}
                    },
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                }
                for hook in hook_names
            ],
        }

    def writes(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path in self.log if method != "GET"]

    def _next(self) -> str:
        self.version += 1
        return str(self.version)

    def handle(self, method: str, path: str, body: bytes | None) -> tuple[int, dict]:
        with self.lock:
            self.log.append((method, path))
            for (fail_method, pattern), status in self.failures.items():
                if fail_method == method and re.search(pattern, path):
                    return status, _status(status, "injected failure")
            if match := _SECRET.match(path):
                return self._secret(method, match.group(1), match.group(2), body)
            if match := _WEBHOOKS.match(path):
                return self._webhook(method, match.group(1), match.group(2), body)
            return 404, _status(404, f"the fake has no {path}")

    def _secret(self, method: str, namespace: str, name: str | None, body: bytes | None) -> tuple[int, dict]:
        key = (namespace, name or "")
        if method == "GET" and name:
            if key not in self.secrets:
                return 404, _status(404, f'secrets "{name}" not found', "NotFound")
            return 200, self.secrets[key]
        document = json.loads(body or b"{}")
        if document.get("type") == "kubernetes.io/tls" and not {"tls.crt", "tls.key"} <= set(document.get("data", {})):
            return 422, _status(422, "data[tls.crt]/data[tls.key]: Required value", "Invalid")
        if method == "POST" and name is None:
            key = (namespace, document["metadata"]["name"])
            if key in self.secrets:
                return 409, _status(409, "already exists", "AlreadyExists")
            document["metadata"]["resourceVersion"] = self._next()
            self.secrets[key] = document
            return 201, document
        if method == "PUT" and name:
            if key not in self.secrets:
                return 404, _status(404, f'secrets "{name}" not found', "NotFound")
            sent = document["metadata"].get("resourceVersion")
            if sent and sent != self.secrets[key]["metadata"]["resourceVersion"]:
                return 409, _status(409, "the object has been modified", "Conflict")
            document["metadata"]["resourceVersion"] = self._next()
            self.secrets[key] = document
            return 200, document
        return 405, _status(405, f"{method} not supported by the fake", "MethodNotAllowed")

    def _webhook(self, method: str, kind: str, name: str, body: bytes | None) -> tuple[int, dict]:
        key = (kind, name)
        if key not in self.webhooks:
            return 404, _status(404, f'{kind}webhookconfigurations "{name}" not found', "NotFound")
        if method == "GET":
            return 200, self.webhooks[key]
        if method == "PATCH":
            try:
                patched = jsonpatch.apply_patch(copy.deepcopy(self.webhooks[key]), json.loads(body or b"[]"))
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
                return 422, _status(422, str(error), "Invalid")
            patched["metadata"]["resourceVersion"] = self._next()
            self.webhooks[key] = patched
            return 200, patched
        return 405, _status(405, f"{method} not supported by the fake", "MethodNotAllowed")


def _status(code: int, message: str, reason: str = "") -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    api: FakeKubeApi

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if self.command == "PATCH" and self.headers.get("Content-Type") != "application/json-patch+json":
            status, document = 415, _status(415, f"unsupported patch type {self.headers.get('Content-Type')}")
        else:
            status, document = self.api.handle(self.command, self.path.split("?", 1)[0], body)
        answer_json(self, status, document)

    do_GET = do_POST = do_PUT = do_PATCH = _serve

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass


class FakeKubeApiServer:
    """Runs a :class:`FakeKubeApi` on a loopback port; use as a context manager."""

    def __init__(self, api: FakeKubeApi | None = None) -> None:
        self.api = api or FakeKubeApi()
        self._listener = Listener(type("Handler", (_Handler,), {"api": self.api}))
        self.url = self._listener.url

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                }
            )
        )
        return path

    def __enter__(self) -> FakeKubeApiServer:
        self._listener.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.__exit__(*exc)
