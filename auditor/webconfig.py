"""``run --web-config-file``: TLS and client certificates for ``/metrics``, in the file shape of the Prometheus
exporter-toolkit (``docs/web-configuration.md`` of prometheus/exporter-toolkit), so that a scrape configuration
written for other exporters fits.

Read: ``tls_server_config`` with ``cert_file``, ``key_file``, ``client_ca_file``, ``client_auth_type``
(``NoClientCert``, ``VerifyClientCertIfGiven``, ``RequireAndVerifyClientCert``) and ``min_version`` (``TLS12``,
``TLS13``). Anything else the toolkit knows (inline certificates, ``basic_auth_users``, ``http_server_config``,
cipher suites) is refused by name rather than ignored: a setting that silently did nothing would leave
``/metrics`` open while its owner believes it closed.

One difference, on purpose: with ``RequireAndVerifyClientCert`` the TLS handshake accepts a client without a
certificate, and ``/metrics`` answers it 403; ``/healthz`` does not ask for one, because the kubelet's HTTPS probes
present none. A certificate that does not verify against ``client_ca_file`` still fails the handshake.

:class:`TlsContexts` reloads the files when they change (a renewed Secret), checked at each new connection.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import yaml

__all__ = ["ClientAuth", "TlsContexts", "WebConfig", "WebConfigError", "load_web_config"]


class WebConfigError(ValueError):
    """The web configuration file cannot be used; the message says which setting and why."""


class ClientAuth(Enum):
    """exporter-toolkit's ``client_auth_type`` values that this server implements."""

    NONE = "NoClientCert"
    IF_GIVEN = "VerifyClientCertIfGiven"
    REQUIRED = "RequireAndVerifyClientCert"


_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version"}


@dataclass(frozen=True)
class WebConfig:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth: ClientAuth = ClientAuth.NONE
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(path for path in (self.cert_file, self.key_file, self.client_ca_file) if path is not None)


def load_web_config(path: str | Path) -> WebConfig:
    """The settings of ``path``, with relative file names taken from the file's own directory (as the toolkit
    does), and the TLS context built once to prove the files usable; raises :class:`WebConfigError`."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise WebConfigError(f"{path}: cannot read: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise WebConfigError(f"{path}: not YAML: {error}") from None
    if not isinstance(document, dict) or set(document) - {"tls_server_config"} or "tls_server_config" not in document:
        found = sorted(document) if isinstance(document, dict) else type(document).__name__
        raise WebConfigError(f"{path}: only tls_server_config is supported, found {found}")
    tls = document["tls_server_config"]
    if not isinstance(tls, dict):
        raise WebConfigError(f"{path}: tls_server_config must be a mapping")
    unknown = sorted(set(tls) - _TLS_KEYS)
    if unknown:
        raise WebConfigError(f"{path}: tls_server_config: not supported: {', '.join(unknown)}")
    missing = [key for key in ("cert_file", "key_file") if not isinstance(tls.get(key), str) or not tls[key]]
    if missing:
        raise WebConfigError(f"{path}: tls_server_config needs {' and '.join(missing)}")
    values = {member.value: member for member in ClientAuth}
    auth = values.get(tls.get("client_auth_type", ClientAuth.NONE.value))
    if auth is None:
        raise WebConfigError(f"{path}: client_auth_type {tls['client_auth_type']!r} is not one of {', '.join(values)}")
    version = _VERSIONS.get(tls.get("min_version", "TLS12"))
    if version is None:
        raise WebConfigError(f"{path}: min_version {tls['min_version']!r} is not one of {', '.join(_VERSIONS)}")
    ca = tls.get("client_ca_file")
    if auth is not ClientAuth.NONE and not ca:
        raise WebConfigError(f"{path}: client_auth_type {auth.value} needs client_ca_file")
    config = WebConfig(
        cert_file=path.parent / tls["cert_file"],
        key_file=path.parent / tls["key_file"],
        client_ca_file=path.parent / ca if ca else None,
        client_auth=auth,
        min_version=version,
    )
    build_context(config)
    return config


def build_context(config: WebConfig) -> ssl.SSLContext:
    """A server context from the files as they are now; raises :class:`WebConfigError` when they do not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = config.min_version
    try:
        context.load_cert_chain(config.cert_file, config.key_file)
        if config.client_ca_file is not None and config.client_auth is not ClientAuth.NONE:
            context.load_verify_locations(cafile=config.client_ca_file)
            context.verify_mode = ssl.CERT_OPTIONAL  # REQUIRED is enforced per path: /healthz stays open
    except (OSError, ssl.SSLError) as error:
        raise WebConfigError(f"cannot load the TLS files: {error}") from None
    return context


def _signature(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...]:
    signature = []
    for path in paths:
        try:
            status = path.stat()
        except OSError:
            signature.append((0, 0, 0))
        else:
            signature.append((status.st_ino, status.st_size, status.st_mtime_ns))
    return tuple(signature)


class TlsContexts:
    """The current server context, rebuilt when a file of the configuration changed (a Secret the kubelet
    refreshed). A rebuild that fails keeps the previous context: a half-written renewal must not stop the scrapes."""

    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._signature = _signature(config.files)
        self._context = build_context(config)
        self.reload_error: str | None = None

    def current(self) -> ssl.SSLContext:
        signature = _signature(self.config.files)
        with self._lock:
            if signature != self._signature:
                try:
                    self._context = build_context(self.config)
                except WebConfigError as error:
                    self.reload_error = str(error)
                else:
                    self._signature, self.reload_error = signature, None
            return self._context
