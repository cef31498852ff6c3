"""``--http-config FILE``: Prometheus' own HTTP client configuration file → a frozen :class:`HttpConfig`.

The same YAML a ``scrape_config`` or ``remote_read`` block takes (prometheus/common ``config.HTTPClientConfig``,
``config/http_config.go`` and ``config/headers.go``), so an operator can reuse the file their Prometheus, Grafana
agent or Thanos sidecar already has::

    basic_auth: {username: finance, password_file: /etc/secrets/prom-password}
    authorization: {type: Bearer, credentials_file: /var/run/secrets/token}   # or bearer_token_file
    tls_config: {ca_file: ca.pem, cert_file: client.pem, key_file: client-key.pem, server_name: prometheus}
    http_headers: {X-Scope-OrgID: {values: [team-a]}}
    follow_redirects: true

As in prometheus/common: relative paths are relative to the file's directory, file contents are trimmed of
surrounding whitespace, at most one of ``basic_auth``, ``authorization`` and ``bearer_token(_file)`` is set,
``authorization.type`` defaults to ``Bearer`` and may not be ``Basic``, reserved headers cannot be set, and
credentials never follow a redirect to another host. Keys Prometheus knows but this client does not implement
(``oauth2``, proxies, ``*_ref`` secrets) are refused by name rather than ignored. Everything is read once, at load.
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ChargebackError
from .files import read_yaml

_TOP = {
    "basic_auth",
    "authorization",
    "bearer_token",
    "bearer_token_file",
    "tls_config",
    "http_headers",
    "follow_redirects",
    "enable_http2",
}
_UNSUPPORTED = {"oauth2", "proxy_url", "no_proxy", "proxy_from_environment", "proxy_connect_header"}
_BASIC = {"username", "username_file", "password", "password_file"}
_AUTHORIZATION = {"type", "credentials", "credentials_file"}
_TLS = {"ca", "ca_file", "cert", "cert_file", "key", "key_file", "server_name", "insecure_skip_verify"}
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_HEADER = {"values", "secrets", "files"}
# prometheus/common config/headers.go ReservedHeaders: set by the client itself, or they change the connection.
RESERVED_HEADERS = frozenset(
    name.lower()
    for name in (
        "Authorization",
        "Host",
        "Content-Encoding",
        "Content-Length",
        "Content-Type",
        "User-Agent",
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Www-Authenticate",
        "Accept-Encoding",
        "X-Prometheus-Remote-Write-Version",
        "X-Prometheus-Remote-Read-Version",
        "X-Prometheus-Scrape-Timeout-Seconds",
        "X-Amz-Date",
        "X-Amz-Security-Token",
        "X-Amz-Content-Sha256",
    )
)


class HttpConfigError(ChargebackError):
    """The HTTP client configuration cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class HttpConfig:
    """What every request to Prometheus carries. ``secret_headers`` never follow a redirect to another host."""

    source: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    secret_headers: tuple[tuple[str, str], ...] = ()
    tls: ssl.SSLContext | None = None
    server_name: str | None = None
    follow_redirects: bool = True

    @property
    def authenticates(self) -> bool:
        return any(name.lower() == "authorization" for name, _ in self.secret_headers)


class _Reader:
    """Typed access to one mapping of the document, every error naming the key path and the file."""

    def __init__(self, document: Any, where: str, source: str, directory: Path, allowed: set[str]) -> None:
        self.source, self.where, self.directory = source, where, directory
        if not isinstance(document, Mapping):
            raise self.error(f"{where or 'the file'} must be a mapping, got {type(document).__name__}")
        for key in document:
            name = f"{where}.{key}" if where else str(key)
            if key in _UNSUPPORTED or str(key).endswith("_ref"):
                raise self.error(f"{name} is not supported by chargeback (supported: {', '.join(sorted(allowed))})")
            if key not in allowed:
                raise self.error(f"unknown key {name!r} (allowed here: {', '.join(sorted(allowed))})")
        self.document = document

    def error(self, message: str) -> HttpConfigError:
        return HttpConfigError(f"--http-config {self.source}: {message}")

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def string(self, key: str) -> str | None:
        value = self.document.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(f"{self.name(key)} must be a string, got {type(value).__name__}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.document.get(key, default)
        if not isinstance(value, bool):
            raise self.error(f"{self.name(key)} must be true or false, got {value!r}")
        return value

    def path(self, key: str) -> Path | None:
        value = self.string(key)
        if value is None or not value:
            return None
        path = Path(value)
        return path if path.is_absolute() else self.directory / path

    def read(self, key: str) -> str | None:
        """The trimmed content of the file named by ``key`` (prometheus/common FileSecret)."""
        path = self.path(key)
        if path is None:
            return None
        try:
            return path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise self.error(f"cannot read {self.name(key)} {path}: {reason}") from None

    def one_of(self, inline: str, file: str) -> str | None:
        if self.document.get(inline) and self.document.get(file):
            raise self.error(f"at most one of {self.name(inline)} and {self.name(file)} may be set")
        return self.string(inline) or self.read(file)

    def section(self, key: str, allowed: set[str]) -> _Reader | None:
        value = self.document.get(key)
        return None if value is None else _Reader(value, self.name(key), self.source, self.directory, allowed)


def http_config_from_mapping(document: Any, source: str, directory: Path) -> HttpConfig:
    top = _Reader({} if document is None else document, "", source, directory, _TOP)
    authorization = _authorization(top)
    headers, secrets = _headers(top)
    if authorization is not None:
        secrets = (("Authorization", authorization), *secrets)
    tls, server_name = _tls(top)
    top.boolean("enable_http2", True)  # accepted for compatibility; this client speaks HTTP/1.1
    return HttpConfig(
        source=source,
        headers=headers,
        secret_headers=secrets,
        tls=tls,
        server_name=server_name,
        follow_redirects=top.boolean("follow_redirects", True),
    )


def _authorization(top: _Reader) -> str | None:
    """The Authorization header value, from basic_auth, authorization or the deprecated bearer_token(_file)."""
    basic = top.section("basic_auth", _BASIC)
    authorization = top.section("authorization", _AUTHORIZATION)
    bearer = top.one_of("bearer_token", "bearer_token_file")
    chosen = [name for name, value in (("basic_auth", basic), ("authorization", authorization)) if value is not None]
    if top.document.get("bearer_token") or top.document.get("bearer_token_file"):
        chosen.append("bearer_token" if top.document.get("bearer_token") else "bearer_token_file")
    if len(chosen) > 1:
        raise top.error(f"at most one of basic_auth, authorization and bearer_token(_file) may be set, got {chosen}")
    if basic is not None:
        username = basic.one_of("username", "username_file") or ""
        password = basic.one_of("password", "password_file") or ""
        return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    if authorization is not None:
        kind = (authorization.string("type") or "").strip() or "Bearer"
        if kind.lower() == "basic":
            raise authorization.error('authorization.type cannot be "Basic": use basic_auth instead')
        credentials = authorization.one_of("credentials", "credentials_file")
        if not credentials:
            raise authorization.error("authorization needs credentials or credentials_file")
        return f"{kind} {credentials}"
    if bearer:
        return f"Bearer {bearer}"
    return None


def _headers(top: _Reader) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """``http_headers``: plain ``values``; ``secrets`` and ``files`` are secret (never sent to another host)."""
    value = top.document.get("http_headers")
    if value is None:
        return (), ()
    if not isinstance(value, Mapping):
        raise top.error(f"http_headers must be a mapping of header name to values, got {type(value).__name__}")
    plain: list[tuple[str, str]] = []
    secret: list[tuple[str, str]] = []
    for name, spec in value.items():
        if not isinstance(name, str) or not name.strip() or any(c in name for c in ":\r\n "):
            raise top.error(f"http_headers has {name!r}, which is not an HTTP header name")
        if name.lower() in RESERVED_HEADERS:
            raise top.error(f"http_headers: setting header {name!r} is not allowed (Prometheus reserves it)")
        header = _Reader(spec, f"http_headers.{name}", top.source, top.directory, _HEADER)
        for kind, target in (("values", plain), ("secrets", secret), ("files", secret)):
            items = header.document.get(kind) or []
            if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
                raise header.error(f"http_headers.{name}.{kind} must be a list of strings")
            for item in items:
                text = _read_header_file(header, kind, item) if kind == "files" else item
                if "\r" in text or "\n" in text:
                    raise header.error(f"http_headers.{name}.{kind} holds a line break, which HTTP headers cannot")
                target.append((name, text))
    return tuple(plain), tuple(secret)


def _read_header_file(header: _Reader, kind: str, item: str) -> str:
    path = Path(item) if Path(item).is_absolute() else header.directory / item
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise header.error(f"cannot read {header.where}.{kind} {path}: {reason}") from None


def _tls(top: _Reader) -> tuple[ssl.SSLContext | None, str | None]:
    section = top.document.get("tls_config")
    if section is None:
        return None, None
    tls = _Reader(section, "tls_config", top.source, top.directory, _TLS | {"min_version", "max_version"})
    if tls.document.get("ca") and tls.document.get("ca_file"):
        raise tls.error("at most one of tls_config.ca and tls_config.ca_file may be set")
    context = ssl.create_default_context()
    try:
        if tls.string("ca"):
            context = ssl.create_default_context(cadata=tls.string("ca"))
        elif tls.path("ca_file") is not None:
            context = ssl.create_default_context(cadata=tls.read("ca_file"))
    except ssl.SSLError as error:
        raise tls.error(f"tls_config CA is not a PEM certificate bundle: {error.reason or error}") from None
    _client_certificate(tls, context)
    for key, attribute in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        name = tls.string(key)
        if name is None:
            continue
        if name not in _TLS_VERSIONS:
            raise tls.error(f"tls_config.{key} {name!r}: expected one of {', '.join(_TLS_VERSIONS)}")
        setattr(context, attribute, _TLS_VERSIONS[name])
    if tls.boolean("insecure_skip_verify", False):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context, (tls.string("server_name") or None)


def _client_certificate(tls: _Reader, context: ssl.SSLContext) -> None:
    cert = tls.one_of("cert", "cert_file")
    key = tls.one_of("key", "key_file")
    if bool(cert) != bool(key):
        missing = "key or key_file" if cert else "cert or cert_file"
        raise tls.error(f"a client certificate needs both a certificate and a key: set tls_config.{missing}")
    if not cert or not key:
        return
    # ssl loads a certificate chain from files only: hand it the files as given, or private copies of inline PEM.
    with tempfile.TemporaryDirectory(prefix="gpu-fence-tls-") as scratch:
        cert_path = tls.path("cert_file") or _private_file(Path(scratch) / "cert.pem", cert)
        key_path = tls.path("key_file") or _private_file(Path(scratch) / "key.pem", key)
        try:
            context.load_cert_chain(str(cert_path), str(key_path))
        except ssl.SSLError as error:
            raise tls.error(
                f"tls_config client certificate and key do not load as a PEM pair: {error.reason or error}"
            ) from None


def _private_file(path: Path, text: str) -> Path:
    path.touch(mode=0o600)
    path.write_text(text, encoding="utf-8")
    return path


def load_http_config(path: Path) -> HttpConfig:
    document = read_yaml(path, f"--http-config {path}", HttpConfigError)
    return http_config_from_mapping(document, str(path), path.parent)
