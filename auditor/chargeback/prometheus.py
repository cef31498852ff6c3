"""The Prometheus side: a small HTTP API client on urllib, and the series → :class:`Interval` conversion.

Every query is a ``/api/v1/query_range`` over the same evaluation instants (``start + step``, ...,
``start + n × step``), so samples of different metrics line up by timestamp. Each instant sees the latest sample
within Prometheus' lookback (5 minutes by default), the same value a dashboard would show at that instant.
Queries aggregate with ``max by (...)`` over the contract's labels so that ``job``/``instance`` (and duplicate
scrapes after an auditor restart) never count twice. Anything with ``query_range`` and a ``name`` is a
:class:`Source`: the client below, or the demo's in-process series (``demo.py``).
"""

from __future__ import annotations

import http.client
import json
import math
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

from ..metrics import label_name  # the name the auditor exports --pod-label KEY under
from .compute import Allocation, ContainerRef, Device, Interval, Memory, Offered, SmActivity, Unattributed
from .errors import ChargebackError
from .httpconfig import HttpConfig
from .times import iso

T = TypeVar("T")
NO_LABEL = "(none)"
# Prometheus refuses more than 11,000 points per series in one range query; stay well below.
MAX_POINTS_PER_QUERY = 10_000

INFO = "max by (node, gpu_uuid, parent_uuid, model, mig_profile) (gpu_fence_gpu_info)"
SHARE = "max by (node, gpu_uuid) (gpu_fence_gpu_share_ratio)"
OFFERED = "max by (node, gpu_uuid) (gpu_fence_gpu_offered_replicas)"
# A scrape without honor_labels keeps the auditor pod's own namespace/pod/container and renames the workload's to
# exported_*: the queries keep exported_namespace so such series are refused instead of billed to the auditor.
RENAMED = "exported_namespace"
MEMORY = (
    f"max by (node, namespace, pod, container, gpu_uuid, allocated, {RENAMED}) (gpu_fence_container_gpu_memory_bytes)"
)
ALLOCATED = f"max by (node, namespace, pod, container, gpu_uuid, {RENAMED}) (gpu_fence_container_allocated_gpus)"
UNATTRIBUTED = "max by (node, gpu_uuid) (gpu_fence_unattributed_gpu_memory_bytes)"
# Not billed: shown beside the bill (absent on devices NVML does not sample, such as MIG).
ACTIVITY = f"max by (node, namespace, pod, container, gpu_uuid, {RENAMED}) (gpu_fence_container_gpu_sm_activity_ratio)"


def pod_labels_query(name: str) -> str:
    """The query for ``--by label:KEY``, where ``name`` is the label the auditor exports KEY as."""
    return f'max by (namespace, pod, {name}) (gpu_fence_pod_labels{{{name}!=""}})'


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


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """Verify the server's certificate against ``server_name`` instead of the URL's host (tls_config.server_name)."""

    def __init__(self, *args: object, server_name: str | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        name = self._server_name or self._tunnel_host or self.host
        self.sock = self._context.wrap_socket(self.sock, server_hostname=name)


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

    def __init__(self, base_url: str, timeout: float = 30.0, http_config: HttpConfig | None = None) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusError(f"--prometheus {base_url!r}: expected an http:// or https:// URL")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.http = http_config or HttpConfig()
        self._opener = urllib.request.build_opener(
            _RedirectHandler(self.http.follow_redirects), _HTTPSHandler(self.http.tls, self.http.server_name)
        )

    @property
    def name(self) -> str:
        return self.base_url

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
        parameters = urllib.parse.urlencode(
            {"query": query, "start": _num(start), "end": _num(end), "step": _num(step)}
        )
        url = f"{self.base_url}/api/v1/query_range?{parameters}"
        body = self._get(url)
        try:
            document = json.loads(body)
        except ValueError:
            raise PrometheusError(
                f"{self.base_url} did not answer like a Prometheus server (no JSON from /api/v1/query_range): "
                "check the --prometheus URL"
            ) from None
        if not isinstance(document, dict) or document.get("status") != "success":
            reason = document.get("error", "unknown error") if isinstance(document, dict) else "unexpected answer"
            raise PrometheusError(f"Prometheus at {self.base_url} refused the query {query!r}: {reason}")
        data = document.get("data") or {}
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"Prometheus at {self.base_url} answered {data.get('resultType')!r}, not a matrix")
        series = []
        for item in data.get("result", []):
            values = tuple((float(ts), float(value)) for ts, value in item.get("values", []))
            series.append(Series(dict(item.get("metric", {})), values))
        return series

    def _get(self, url: str) -> bytes:
        request = urllib.request.Request(url, headers={"Accept": "application/json"})  # noqa: S310 (scheme checked)
        for name, value in _joined(self.http.headers).items():
            request.add_header(name, value)
        for name, value in _joined(self.http.secret_headers).items():
            request.add_unredirected_header(name, value)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return response.read()
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
            raise PrometheusError(f"Prometheus at {self.base_url} did not answer within {self.timeout:g} s") from None
        except (OSError, http.client.HTTPException) as error:
            reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
            raise PrometheusError(f"cannot reach Prometheus at {self.base_url}: {reason}") from None

    def _http_error(self, error: urllib.error.HTTPError) -> str:
        detail = _error_detail(error)
        message = f"Prometheus at {self.base_url} answered HTTP {error.code} {error.reason}"
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


def instant_key(timestamp: float) -> int:
    """An instant as Prometheus keeps it, in whole milliseconds: samples of different queries match by it."""
    return round(timestamp * 1000)


def intervals_from_series(
    instants: Sequence[float],
    step: float,
    *,
    info: list[Series],
    share: list[Series],
    memory: list[Series],
    allocated: list[Series],
    unattributed: list[Series],
    group_of: Callable[[str, str], str],
    offered: Sequence[Series] = (),
    activity: Sequence[Series] = (),
) -> tuple[list[Interval], list[str]]:
    """Regroup per-series samples into one :class:`Interval` per instant. Pure; returns notes beside them."""
    for name, items in (
        ("gpu_fence_container_gpu_memory_bytes", memory),
        ("gpu_fence_container_allocated_gpus", allocated),
        ("gpu_fence_container_gpu_sm_activity_ratio", activity),
    ):
        renamed = next((item.labels for item in items if item.labels.get(RENAMED)), None)
        if renamed is not None:
            raise PrometheusError(
                f"{name} carries {RENAMED}={renamed[RENAMED]!r}: Prometheus scraped the auditor without honor_labels "
                f"and replaced the workload's namespace/pod/container with the auditor pod's own "
                f"({renamed.get('namespace', '')}/{renamed.get('pod', '')}); scrape it with honor_labels: true "
                "(honorLabels in a ServiceMonitor, see docs/metrics.md)"
            )
    notes: list[str] = []
    slots = {instant_key(instant): instant for instant in instants}
    devices: dict[int, list[Device]] = defaultdict(list)
    shares: dict[tuple[int, str, str], float] = {}
    for item in share:
        for ts, value in item.values:
            if math.isfinite(value) and value >= 0:
                shares[(instant_key(ts), item.labels.get("node", ""), item.labels.get("gpu_uuid", ""))] = value
    missing_share: set[str] = set()
    for item in info:
        labels = item.labels
        node, uuid, parent = labels.get("node", ""), labels.get("gpu_uuid", ""), labels.get("parent_uuid", "")
        for ts, _ in item.values:
            ratio = 1.0
            if parent:
                found = shares.get((instant_key(ts), node, uuid))
                if found is None:
                    missing_share.add(uuid)
                    continue
                ratio = found
            devices[instant_key(ts)].append(Device(node, uuid, parent, labels.get("model", ""), ratio))
    if missing_share:
        notes.append(
            f"{len(missing_share)} MIG device(s) had no gpu_fence_gpu_share_ratio, so their card's share is "
            f"counted as idle (e.g. {sorted(missing_share)[0]})"
        )

    def owner(labels: Mapping[str, str]) -> ContainerRef:
        namespace, pod = labels.get("namespace", ""), labels.get("pod", "")
        return ContainerRef(namespace, pod, labels.get("container", ""), group_of(namespace, pod))

    def device(labels: Mapping[str, str]) -> tuple[str, str]:
        return labels.get("node", ""), labels.get("gpu_uuid", "")

    def allocated_flag(labels: Mapping[str, str]) -> bool:
        return labels.get("allocated", "true") != "false"

    # Each series' labels fix everything but the value: a partial that makes one sample from a value.
    memory_at = _at(memory, lambda labels: partial(Memory, *device(labels), owner(labels), allocated_flag(labels)))
    allocations_at = _at(allocated, lambda labels: partial(Allocation, *device(labels), owner(labels)))
    unattributed_at = _at(unattributed, lambda labels: partial(Unattributed, *device(labels)))
    offered_at = _at(offered, lambda labels: partial(Offered, *device(labels)))
    # an idle container's 0 is kept: sampled and idle is not the same as not sampled
    activity_at = _at(activity, lambda labels: partial(SmActivity, *device(labels), owner(labels)), keep_zero=True)

    intervals = [
        Interval(
            end=instant,
            seconds=step,
            devices=tuple(devices.get(key, ())),
            memory=tuple(memory_at.get(key, ())),
            allocations=tuple(allocations_at.get(key, ())),
            unattributed=tuple(unattributed_at.get(key, ())),
            offered=tuple(offered_at.get(key, ())),
            activity=tuple(activity_at.get(key, ())),
        )
        for key, instant in sorted(slots.items())
    ]
    return intervals, notes


def _at(
    series: Sequence[Series], sample_of: Callable[[Mapping[str, str]], Callable[[float], T]], *, keep_zero: bool = False
) -> dict[int, list[T]]:
    """Every finite, positive (or, with ``keep_zero``, non-negative) sample of ``series``, made by
    ``sample_of(labels)(value)``, by instant."""
    result: dict[int, list[T]] = defaultdict(list)
    for item in series:
        make = sample_of(item.labels)
        for ts, value in item.values:
            if math.isfinite(value) and (value > 0 or (keep_zero and value == 0)):
                result[instant_key(ts)].append(make(value))
    return result


def pod_groups(series: list[Series], label: str) -> dict[tuple[str, str], str]:
    """(namespace, pod) → the value of ``label`` on ``gpu_fence_pod_labels``; the latest value wins."""
    latest: dict[tuple[str, str], tuple[float, str]] = {}
    for item in series:
        value = item.labels.get(label, "")
        if not value or not item.values:
            continue
        key = (item.labels.get("namespace", ""), item.labels.get("pod", ""))
        seen = item.values[-1][0]
        if key not in latest or seen >= latest[key][0]:
            latest[key] = (seen, value)
    return {key: value for key, (_, value) in latest.items()}


def grouping(source: Source, by: str, first: float, last: float, step: float) -> Callable[[str, str], str]:
    """(namespace, pod) → its group: the namespace, or with ``label:KEY`` the pod's label as the auditor exports it."""
    if by == "namespace":

        def group_of(namespace: str, pod: str) -> str:
            return namespace or NO_LABEL

        return group_of
    key = by.removeprefix("label:")
    name = label_name(key)
    groups = pod_groups(source.query_range(pod_labels_query(name), first, last, step), name)
    if not groups:
        raise PrometheusError(
            f"no gpu_fence_pod_labels series carries {name} (pod label {key!r}) between {iso(first)} and "
            f"{iso(last)}: run the auditor with --pod-label {key}, or check the label key"
        )

    def group_of_pod(namespace: str, pod: str) -> str:
        return groups.get((namespace, pod), NO_LABEL)

    return group_of_pod


def instants_of(start: float, step: float, count: int) -> list[float]:
    """The instants a bill of ``count`` intervals of ``step`` seconds after ``start`` is evaluated at."""
    return [start + step * index for index in range(1, count + 1)]


def fetch_intervals(
    source: Source, start: float, step: float, count: int, group_of: Callable[[str, str], str]
) -> tuple[list[Interval], list[str]]:
    """Query everything chargeback needs for ``count`` intervals of ``step`` seconds after ``start``."""
    first, last = start + step, start + count * step
    info = source.query_range(INFO, first, last, step)
    if not any(item.values for item in info):
        raise PrometheusError(
            f"no gpu_fence_gpu_info samples at {source.name} between {iso(start)} and {iso(last)}: "
            "check the time range and that Prometheus scrapes the auditor"
        )
    return intervals_from_series(
        instants_of(start, step, count),
        step,
        info=info,
        share=source.query_range(SHARE, first, last, step),
        memory=source.query_range(MEMORY, first, last, step),
        allocated=source.query_range(ALLOCATED, first, last, step),
        unattributed=source.query_range(UNATTRIBUTED, first, last, step),
        offered=source.query_range(OFFERED, first, last, step),
        activity=source.query_range(ACTIVITY, first, last, step),
        group_of=group_of,
    )
