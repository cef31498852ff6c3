"""The Prometheus HTTP API client, on urllib: ``query_range`` and ``query``, every failure one line.

Anything with ``query_range`` and a ``name`` is a :class:`Source` (the client, or the demo's in-process series in
``demo.py``); the recorded series' bill also needs instant queries (:class:`InstantSource`). What is asked, and how
the answers become a bill, is in ``raw.py`` and ``recorded.py``.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, runtime_checkable

from .errors import ChargebackError
from .httpconfig import HttpConfig

# Prometheus refuses more than 11,000 points per series in one range query; stay well below.
MAX_POINTS_PER_QUERY = 10_000
# What stops a long query on the server's side, by server (their flags' own names and defaults).
SERVER_TIMEOUTS = "Prometheus: --query.timeout, 2m by default; Thanos Query: --query.timeout; Mimir: -querier.timeout"
# Longer URL-encoded queries go in a POST body (Go's HTTP server, and most proxies, take URLs of ~8 KB and more).
MAX_GET_QUERY = 6000


class PrometheusError(ChargebackError):
    pass


@dataclass(frozen=True)
class Series:
    labels: Mapping[str, str]
    values: tuple[tuple[float, float], ...]


class Source(Protocol):
    """Where the series come from; ``name`` is how messages and the report's provenance call it."""

    @property
    def name(self) -> str: ...

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Series]: ...


@runtime_checkable
class InstantSource(Source, Protocol):
    def query(self, query: str, at: float) -> list[Series]: ...


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """Verify the server's certificate against ``server_name`` instead of the URL's host (tls_config.server_name)."""

    def __init__(self, host: str, *, server_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)  # what urllib's do_open passes: timeout, context
        self._server_name = server_name

    def connect(self) -> None:
        # HTTPSConnection.connect (CPython Lib/http/client.py) with the name to verify replaced: it reads the proxy
        # tunnel's host and the TLS context from attributes of its own that typeshed does not declare.
        http.client.HTTPConnection.connect(self)
        name = self._server_name or self._tunnel_host or self.host  # type: ignore[attr-defined]
        self.sock = self._context.wrap_socket(self.sock, server_hostname=name)  # type: ignore[attr-defined]


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext | None, server_name: str | None) -> None:
        super().__init__(context=context)
        self._tls, self._server_name = context, server_name

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = partial(_NamedHTTPSConnection, server_name=self._server_name)
        return self.do_open(connection, req, context=self._tls)


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follow redirects unless follow_redirects is false; credentials only ever go back to the same host."""

    def __init__(self, follow: bool) -> None:
        self.follow = follow

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]  # noqa: PLR0917
        if not self.follow:
            return None  # urllib raises the 3xx as an HTTPError
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc == urllib.parse.urlsplit(req.full_url).netloc:
            for name, value in req.unredirected_hdrs.items():
                new.add_unredirected_header(name, value)
        return new


class PrometheusClient:
    """Just ``query_range``, with every failure mapped to one line naming the server and what went wrong."""

    def __init__(
        self, base_url: str, timeout: float = 30.0, http_config: HttpConfig | None = None, timeout_said: str = ""
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"--prometheus {base_url!r}: expected an http:// or https:// URL")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.timeout_said = timeout_said  # where the timeout came from, when not from --timeout
        self.http = http_config or HttpConfig()
        self._opener = urllib.request.build_opener(
            _RedirectHandler(self.http.follow_redirects), _HTTPSHandler(self.http.tls, self.http.server_name)
        )

    @property
    def name(self) -> str:
        return self.base_url

    def query(self, query: str, at: float) -> list[Series]:
        """An instant query at ``at`` (``/api/v1/query``): one sample per series, or every sample of a range
        selector (``metric[1h]``) as stored, with its own timestamp."""
        document = self._api("query", {"query": query, "time": _num(at)}, query)
        data = document.get("data") or {}
        kind = data.get("resultType")
        if kind not in ("vector", "matrix"):
            raise PrometheusError(f"Prometheus at {self.base_url} answered {kind!r}, not a vector")
        series = []
        for item in data.get("result", []):
            if kind == "matrix":
                values = tuple((float(ts), float(value)) for ts, value in item.get("values", []))
            else:
                ts, value = item.get("value", (at, "NaN"))
                values = ((float(ts), float(value)),)
            series.append(Series(dict(item.get("metric", {})), values))
        return series

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        """Samples at ``start, start + step, ... <= end``; long ranges are fetched in chunks and joined."""
        merged: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
        chunk = step * MAX_POINTS_PER_QUERY
        chunk_start = start
        while chunk_start <= end:
            chunk_end = min(end, chunk_start + chunk - step)
            for item in self._query_range_once(query, chunk_start, chunk_end, step):
                merged[tuple(sorted(item.labels.items()))].extend(item.values)
            chunk_start = chunk_end + step
        return [Series(dict(labels), tuple(values)) for labels, values in merged.items()]

    def _query_range_once(self, query: str, start: float, end: float, step: float) -> list[Series]:
        parameters = {"query": query, "start": _num(start), "end": _num(end), "step": _num(step)}
        document = self._api("query_range", parameters, query)
        data = document.get("data") or {}
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"Prometheus at {self.base_url} answered {data.get('resultType')!r}, not a matrix")
        series = []
        for item in data.get("result", []):
            values = tuple((float(ts), float(value)) for ts, value in item.get("values", []))
            series.append(Series(dict(item.get("metric", {})), values))
        return series

    def _api(self, endpoint: str, parameters: Mapping[str, str], query: str) -> dict[str, Any]:
        """One call of ``/api/v1/<endpoint>``: GET, or POST (which Prometheus, Thanos and Mimir all accept) when the
        query would make the URL longer than servers and proxies take."""
        encoded = urllib.parse.urlencode(parameters)
        url = f"{self.base_url}/api/v1/{endpoint}"
        body = self._get(f"{url}?{encoded}") if len(encoded) <= MAX_GET_QUERY else self._get(url, encoded.encode())
        try:
            document = json.loads(body)
        except ValueError:
            raise PrometheusError(
                f"{self.base_url} did not answer like a Prometheus server (no JSON from /api/v1/{endpoint}): "
                "check the --prometheus URL"
            ) from None
        if not isinstance(document, dict) or document.get("status") != "success":
            reason = document.get("error", "unknown error") if isinstance(document, dict) else "unexpected answer"
            shown = query if len(query) <= 200 else query[:200] + "..."
            raise PrometheusError(f"Prometheus at {self.base_url} refused the query {shown!r}: {reason}")
        return document

    def _get(self, url: str, form: bytes | None = None) -> bytes:
        headers = {"Accept": "application/json"}
        if form is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        request = urllib.request.Request(url, data=form, headers=headers)  # noqa: S310 (scheme checked)
        for name, value in _joined(self.http.headers).items():
            request.add_header(name, value)
        for name, value in _joined(self.http.secret_headers).items():
            request.add_unredirected_header(name, value)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as error:
            raise PrometheusError(self._http_error(error)) from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, ssl.SSLError):
                raise PrometheusError(self._tls_error(error.reason)) from None
            reason = getattr(error.reason, "strerror", None) or str(error.reason)
            raise PrometheusError(f"cannot reach Prometheus at {self.base_url}: {reason}") from None
        except ssl.SSLError as error:  # raised past urllib when TLS 1.3 refuses the client after the handshake
            raise PrometheusError(self._tls_error(error)) from None
        except TimeoutError:
            said = f" ({self.timeout_said})" if self.timeout_said else ""
            raise PrometheusError(
                f"Prometheus at {self.base_url} did not answer within {self.timeout:g} s{said}: pass --timeout "
                f"{2 * self.timeout:g}, and if the server stops the query first, raise its own limit above that "
                f"({SERVER_TIMEOUTS})"
            ) from None
        except (OSError, http.client.HTTPException) as error:
            reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
            raise PrometheusError(f"cannot reach Prometheus at {self.base_url}: {reason}") from None

    def _http_error(self, error: urllib.error.HTTPError) -> str:
        detail = _error_detail(error)
        message = f"Prometheus at {self.base_url} answered HTTP {error.code} {error.reason}"
        if "timed out" in detail or "deadline exceeded" in detail:
            return f"{message}: {detail}: the server stopped the query at its own limit: raise it ({SERVER_TIMEOUTS})"
        if error.code in (401, 403):
            if self.http.authenticates:
                hint = f"check the credentials in --http-config {self.http.source}"
            elif self.http.source:
                hint = f"--http-config {self.http.source} sends no credentials: add basic_auth or authorization"
            else:
                hint = "pass credentials with --http-config FILE (basic_auth, authorization)"
            return f"{message}: {hint}"
        if 300 <= error.code < 400:
            return f"{message}: redirect to {error.headers.get('Location', '?')} not followed (follow_redirects: false)"
        return f"{message}: {detail}" if detail and detail != str(error.reason) else message

    def _tls_error(self, error: ssl.SSLError) -> str:
        where = f"--http-config {self.http.source}" if self.http.source else "--http-config FILE"
        if isinstance(error, ssl.SSLCertVerificationError):
            reason = error.verify_message or error.reason or "certificate verify failed"
            message = f"TLS with Prometheus at {self.base_url} failed: certificate verify failed: {reason.rstrip('.')}"
            if "mismatch" in reason:
                return f"{message}: set tls_config.server_name in {where} to a name the certificate holds"
            return f"{message}: set tls_config.ca_file in {where} to the CA that signed the server's certificate"
        message = f"TLS with Prometheus at {self.base_url} failed: {error.reason or error}"
        text = str(error).upper()
        if "CERTIFICATE_REQUIRED" in text or "BAD_CERTIFICATE" in text or "UNKNOWN_CA" in text:
            return (
                f"{message}: the server wants a client certificate it trusts: "
                f"set tls_config.cert_file and key_file in {where}"
            )
        if "WRONG_VERSION_NUMBER" in text or "RECORD_LAYER" in text:
            return f"{message}: the server does not speak TLS there (try http://)"
        return message


def _joined(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Repeated header names as one comma-separated value, as HTTP allows (RFC 9110 §5.3)."""
    joined: dict[str, list[str]] = defaultdict(list)
    for name, value in headers:
        joined[name].append(value)
    return {name: ", ".join(values) for name, values in joined.items()}


def _num(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _error_detail(error: urllib.error.HTTPError) -> str:
    try:
        document = json.loads(error.read())
        return str(document.get("error") or error.reason)
    except (ValueError, AttributeError, OSError):
        return str(error.reason)
