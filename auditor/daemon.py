"""The ``once`` and ``run`` subcommands: audit this node one time, or forever with metrics, health and Events.

``once`` prints the report and exits 0 (clean), 1 (findings) or 2 (could not audit, one line saying why).
``run`` loops every ``--interval`` seconds, serves ``/metrics`` and ``/healthz``, posts deduplicated Events, and
survives every per-cycle failure (kubelet down or restarting, NVML errors, a lost GPU, the API server down, a
process exiting mid-read) with exponential backoff, counting each in ``gpu_fence_audit_cycle_failures_total``.
It exits 0 on SIGTERM/SIGINT.

NVML, gRPC, the ``kubernetes`` client and prometheus_client are imported inside functions so ``--help`` stays fast.
"""

# ruff: noqa: PLC0415  (heavy imports are deferred on purpose, see the module docstring)
from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpu_fence import kai, logs
from gpu_fence.exit_status import ExitStatus

from .audit import audit
from .model import AuditPolicy, AuditResult, NodeSnapshot
from .report import FORMATS, render
from .snapshot import CollectError, SnapshotOptions, Sources, collect

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULTS = {
    "interval": 30.0,
    "metrics_port": 9400,
    "metrics_bind": "0.0.0.0",  # noqa: S104 - a DaemonSet's metrics are scraped from other pods
    "unhealthy_after": 3,
    "event_interval": 60.0,
    "max_backoff": 300.0,
    "pod_relist_interval": 60.0,
}

ONCE_EXAMPLES = """\
examples:
  gpu-fence-auditor once --format json --exempt-namespace gpu-operator
  gpu-fence-auditor once --host-proc /host/proc --nvml-lib /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1
  gpu-fence-auditor once --no-kubernetes --format junit --output audit.xml

exit codes: 0 clean, 1 findings, 2 could not audit (the reason is printed on stderr)
"""

RUN_EXAMPLES = """\
examples:
  gpu-fence-auditor run --interval 30 --metrics-port 9400 --exempt-namespace gpu-operator
  gpu-fence-auditor run --host-proc /host/proc --pod-label team --pod-label app.kubernetes.io/part-of

/healthz answers 503 when no cycle succeeded for --unhealthy-after intervals; exits 0 on SIGTERM.
"""


def add_arguments(subparsers: Any) -> None:
    once = subparsers.add_parser(
        "once",
        help="audit this node once and print the report",
        description="Audit every container on this node once: allocated vs visible vs used GPUs.",
        epilog=ONCE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_audit_arguments(once)
    once.add_argument("--format", choices=FORMATS, default="text", help="report format (default: text)")
    once.add_argument("--output", metavar="FILE", help="write the report to FILE instead of stdout")
    once.set_defaults(run=run_once)

    run = subparsers.add_parser(
        "run",
        help="audit this node in a loop; serve /metrics and /healthz; post Events",
        description="Audit this node every --interval seconds, export metrics and post GPUOverreach Events.",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_audit_arguments(run)
    run.add_argument(
        "--interval",
        type=_positive,
        default=DEFAULTS["interval"],
        metavar="S",
        help="seconds between cycles (default: 30)",
    )
    run.add_argument(
        "--metrics-port",
        type=_port,
        default=DEFAULTS["metrics_port"],
        metavar="P",
        help="port of /metrics and /healthz (default: 9400; 0 picks a free one)",
    )
    run.add_argument(
        "--metrics-bind",
        default=DEFAULTS["metrics_bind"],
        metavar="ADDR",
        help="address to serve on (default: 0.0.0.0)",
    )
    run.add_argument(
        "--unhealthy-after",
        type=int,
        default=DEFAULTS["unhealthy_after"],
        metavar="N",
        help="/healthz fails when the last successful cycle is older than N intervals (default: 3)",
    )
    run.add_argument(
        "--event-interval",
        type=_positive,
        default=DEFAULTS["event_interval"],
        metavar="MIN",
        help="re-emit the Event of a finding that persists at most every MIN minutes (default: 60)",
    )
    run.add_argument("--no-events", action="store_true", help="do not post Kubernetes Events")
    run.add_argument(
        "--max-backoff",
        type=_positive,
        default=DEFAULTS["max_backoff"],
        metavar="S",
        help="longest wait after repeated failed cycles (default: 300)",
    )
    run.set_defaults(run=run_daemon)


def _add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pod-resources-socket",
        default=DEFAULT_SOCKET,
        metavar="P",
        help=f"kubelet PodResources socket (default: {DEFAULT_SOCKET})",
    )
    parser.add_argument(
        "--host-proc",
        default="/proc",
        metavar="DIR",
        help="host proc root (default: /proc; /host/proc in the DaemonSet)",
    )
    parser.add_argument("--nvml-lib", metavar="P", help="path of libnvidia-ml.so.1 (default: the library path)")
    parser.add_argument(
        "--node",
        default=os.environ.get("NODE_NAME"),
        metavar="NAME",
        help="this node's name (default: $NODE_NAME, else the host name)",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="F",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then the in-cluster service account)",
    )
    parser.add_argument(
        "--no-kubernetes",
        action="store_true",
        help="do not use the Kubernetes API: names from PodResources and /proc only, no Events",
    )
    parser.add_argument(
        "--exempt-namespace",
        action="append",
        default=[],
        metavar="NS",
        help="report this namespace's containers but never flag them (repeatable; use it for gpu-operator)",
    )
    parser.add_argument(
        "--pod-label",
        action="append",
        default=[],
        metavar="KEY",
        help="export this pod label for chargeback grouping (repeatable)",
    )
    parser.add_argument(
        "--kai-reservation-namespace",
        default=kai.DEFAULT_RESERVATION_NAMESPACE,
        metavar="NS",
        help=f"namespace of KAI's GPU reservation pods (default: {kai.DEFAULT_RESERVATION_NAMESPACE})",
    )
    parser.add_argument(
        "--kai-scheduler-name",
        action="append",
        default=None,
        metavar="NAME",
        help=f"schedulerName of KAI fractional pods (repeatable; default: {', '.join(kai.DEFAULT_SCHEDULER_NAMES)})",
    )
    parser.add_argument(
        "--pod-relist-interval",
        type=_positive,
        default=DEFAULTS["pod_relist_interval"],
        metavar="S",
        help="relist this node's pods at least every S seconds (default: 60)",
    )


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return int(text)


# --- one auditor, shared by once and run -----------------------------------------------------------------


class Auditor:
    """Holds the adapters across cycles and runs one cycle at a time."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.node = args.node or socket.gethostname()
        self.options = SnapshotOptions(
            node=self.node,
            pod_label_keys=tuple(args.pod_label),
            kai_reservation_namespace=args.kai_reservation_namespace,
            kai_scheduler_names=tuple(args.kai_scheduler_name or kai.DEFAULT_SCHEDULER_NAMES),
        )
        self.policy = AuditPolicy(
            exempt_namespaces=frozenset(args.exempt_namespace),
            kai_reservation_namespace=args.kai_reservation_namespace,
        )
        self.api_client: Any = None
        self.api_problem: str | None = None
        self._sources: Sources | None = None
        #: PodResources RPCs made, by method, over every client this auditor built (one is rebuilt per outage).
        self.kubelet_calls: Counter[str] = Counter()
        self.cycles = 0  # cycles attempted

    def _freeze_long_lived(self) -> None:
        """Once, before the second cycle: take what the process holds for good out of the cyclic collector's reach.

        By then every library is imported and every adapter open (hundreds of thousands of objects that live as
        long as the process); a full collection traversed them all, ~30 ms on a node of 120,000 processes, landing in
        whichever phase allocated at the time. Frozen, a full collection scans only what cycles allocate (~2 ms). The
        first cycle's own objects are released by then; a collection first clears any cyclic garbage among them.
        """
        gc.collect()
        gc.freeze()

    def preflight(self) -> None:
        """Fail fast, with what to fix, on what no cycle could ever get past."""
        if not Path(self.args.host_proc).is_dir():
            raise CollectError(
                "proc",
                f"host proc root {self.args.host_proc} is not a directory (mount the host's "
                "/proc and pass --host-proc)",
            )
        if not self.args.no_kubernetes:
            from .kube import KubernetesUnavailable, load_api_client

            try:
                self.api_client = load_api_client(self.args.kubeconfig)
            except KubernetesUnavailable as error:
                self.api_problem = error.reason

    def sources(self) -> Sources:
        if self._sources is None:
            from .hostproc import HostProc
            from .kube import PodCache

            pods = None
            if self.api_client is not None:
                pods = PodCache(self.api_client, self.node, relist_interval=self.args.pod_relist_interval)
            self._sources = Sources(podresources=None, nvml=None, hostproc=HostProc(self.args.host_proc), pods=pods)
        sources = self._sources
        if sources.podresources is None:
            sources.podresources = self._podresources()
        if sources.nvml is None:
            sources.nvml = self._nvml()
        return sources

    def _podresources(self) -> Any:
        socket_path = self.args.pod_resources_socket
        if not os.path.exists(socket_path):
            raise CollectError(
                "kubelet",
                f"kubelet PodResources socket {socket_path} does not exist (mount /var/lib/kubelet/pod-resources "
                "from the host, or pass --pod-resources-socket)",
            )
        from .podresources.client import PodResourcesClient

        return PodResourcesClient(socket_path, calls=self.kubelet_calls)

    def _nvml(self) -> Any:
        from .nvml import Nvml, NvmlError

        nvml = Nvml(self.args.nvml_lib)
        try:
            nvml.open()
        except NvmlError as error:
            raise CollectError("nvml", str(error)) from error
        return nvml

    def cycle(self) -> tuple[NodeSnapshot, AuditResult]:
        self.cycles += 1
        if self.cycles == 2:
            self._freeze_long_lived()
        try:
            sources = self.sources()
            snapshot = collect(sources, self.options)
        except CollectError as error:
            # Start the failing adapter afresh next cycle: a restarted kubelet makes a new socket, a
            # re-initialised NVML sees GPUs that came back.
            if error.source == "kubelet":
                self._drop("podresources")
            elif error.source == "nvml":
                self._drop("nvml")
            raise
        if self.api_problem:
            snapshot = _with_note(snapshot, f"Kubernetes API unavailable: {self.api_problem}")
        return snapshot, audit(snapshot, self.policy)

    def _drop(self, name: str) -> None:
        if self._sources is None:
            return
        adapter = getattr(self._sources, name)
        setattr(self._sources, name, None)
        if adapter is not None:
            with contextlib.suppress(Exception):  # closing a broken adapter has nothing left to report
                adapter.close()

    def close(self) -> None:
        self._drop("podresources")
        self._drop("nvml")


def _with_note(snapshot: NodeSnapshot, note: str) -> NodeSnapshot:
    from dataclasses import replace

    return replace(snapshot, notes=(*snapshot.notes, note))


# --- once ------------------------------------------------------------------------------------------------


def run_once(args: argparse.Namespace) -> ExitStatus:
    auditor = Auditor(args)
    try:
        auditor.preflight()
        snapshot, result = auditor.cycle()
    except CollectError as error:
        print(f"gpu-fence-auditor once: cannot audit: {error.reason}", file=sys.stderr)
        return ExitStatus.ERROR
    finally:
        auditor.close()
    text = render(args.format, snapshot, result)
    if args.output:
        target = Path(args.output)
        temporary = target.with_name(f".{target.name}.tmp")
        try:
            temporary.write_text(text, encoding="utf-8")
            temporary.replace(target)
        except OSError as error:
            print(f"gpu-fence-auditor once: cannot write --output {args.output}: {error.strerror}", file=sys.stderr)
            return ExitStatus.ERROR
    else:
        sys.stdout.write(text)
    return ExitStatus.FINDINGS if result.findings else ExitStatus.SUCCESS


# --- run -------------------------------------------------------------------------------------------------


log = logging.getLogger("gpu_fence.auditor")


class Health:
    """``/healthz``: healthy while a cycle succeeded within ``unhealthy_after`` intervals."""

    def __init__(self, interval: float, unhealthy_after: int, clock: Callable[[], float] = time.time) -> None:
        self.window = interval * max(unhealthy_after, 1)
        self._clock = clock
        self.started = clock()
        self.last_success: float | None = None
        self.last_error: str | None = None

    def check(self) -> tuple[int, str]:
        now = self._clock()
        if self.last_success is None:
            if now - self.started <= self.window:
                return 200, "starting: no cycle completed yet"
            return 503, f"no successful audit cycle in {now - self.started:.0f}s: {self.last_error or 'unknown'}"
        age = now - self.last_success
        if age > self.window:
            return 503, f"last successful audit cycle {age:.0f}s ago: {self.last_error or 'unknown'}"
        return 200, f"ok: last successful audit cycle {age:.0f}s ago"


def serve_http(bind: str, port: int, metrics: Any, health: Health) -> ThreadingHTTPServer:
    from .metrics import CONTENT_TYPE

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, metrics.exposition(), CONTENT_TYPE)
            elif path == "/healthz":
                code, message = health.check()
                self._send(code, (message + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found: try /metrics or /healthz\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((bind, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    return server


def backoff(interval: float, failures_in_row: int, maximum: float) -> float:
    """Wait before the next cycle: the interval, doubled per consecutive failure, capped."""
    if failures_in_row <= 0:
        return interval
    # The exponent is bounded: 2**n of a days-long outage would overflow a float and end the loop.
    return min(interval * 2 ** min(failures_in_row - 1, 64), max(maximum, interval))


def run_daemon(args: argparse.Namespace) -> ExitStatus:
    from .kube import EventRecorder
    from .metrics import AuditorMetrics

    # gRPC's C core logs to stderr in its own format (a kubelet restart prints a GOAWAY line); our JSON lines say
    # what matters, so silence it unless the operator asks for it.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    logs.configure("INFO")  # JSON lines on stderr, the shape the webhook's serve writes too
    clash = _label_clash(args.pod_label)
    if clash:
        print(f"gpu-fence-auditor run: {clash}", file=sys.stderr)
        return ExitStatus.ERROR
    auditor = Auditor(args)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        auditor.preflight()
    except CollectError as error:
        print(f"gpu-fence-auditor run: cannot start: {error.reason}", file=sys.stderr)
        return ExitStatus.ERROR
    health = Health(args.interval, args.unhealthy_after)
    # The per-container series go stale with /healthz: an audit older than the health window is no measurement.
    metrics = AuditorMetrics(auditor.node, args.pod_label, stale_after=health.window)
    try:
        server = serve_http(args.metrics_bind, args.metrics_port, metrics, health)
    except OSError as error:
        print(
            f"gpu-fence-auditor run: cannot serve on {args.metrics_bind}:{args.metrics_port}: {error.strerror}",
            file=sys.stderr,
        )
        return ExitStatus.ERROR
    events = None
    if auditor.api_client is not None and not args.no_events:
        events = EventRecorder(auditor.api_client, auditor.node, reemit_after=args.event_interval * 60)
    port = server.server_address[1]
    logs.event(
        log,
        "started",
        f"auditing node {auditor.node}, serving /metrics and /healthz on port {port}",
        node=auditor.node,
        port=port,
        interval=args.interval,
        kubernetes=auditor.api_client is not None,
        problem=auditor.api_problem,
    )

    failures_in_row = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            snapshot, result = auditor.cycle()
        except CollectError as error:
            failures_in_row += 1
            health.last_error = error.reason
            metrics.failed(error.source)
            metrics.sync_kubelet_calls(auditor.kubelet_calls)
            logs.event(
                log,
                "cycle-failed",
                error.reason,
                level=logging.WARNING,
                reason=error.source,
                failures_in_row=failures_in_row,
            )
        except Exception as error:
            failures_in_row += 1
            health.last_error = f"internal error: {error}"
            metrics.failed("internal")
            logs.event(
                log,
                "cycle-failed",
                f"internal error: {error}",
                level=logging.ERROR,
                exc_info=error if args.debug else None,
                reason="internal",
                failures_in_row=failures_in_row,
            )
        else:
            failures_in_row = 0
            duration = time.monotonic() - started
            metrics.observe(snapshot, result, duration)
            metrics.sync_kubelet_calls(auditor.kubelet_calls)
            health.last_success = time.time()
            _count_degraded(snapshot, metrics)
            written = 0
            if events is not None:
                failures_before = events.failures
                written = events.record(result.findings)
                if events.failures > failures_before:
                    metrics.failed("kubernetes-api")
            logs.event(
                log,
                "cycle",
                f"audited {len(result.rows)} containers: {len(result.findings)} findings",
                node=snapshot.node,
                duration_seconds=round(duration, 4),
                containers=len(result.rows),
                findings=len(result.findings),
                identity=snapshot.identity_source,
                events=written,
                notes=list(snapshot.notes) or None,
            )
            for finding in result.findings:
                logs.event(
                    log,
                    "finding",
                    finding.message,
                    level=logging.WARNING,
                    kind=finding.kind.value,
                    namespace=finding.namespace,
                    pod=finding.pod,
                    container=finding.container,
                    gpu=finding.gpu,
                    pid=finding.pid,
                    memory_bytes=finding.memory_bytes,
                )
            # Not kept while the next cycle builds its own: two node-sized snapshots would meet at the RSS peak.
            del snapshot, result
        delay = backoff(args.interval, failures_in_row, args.max_backoff)
        stop.wait(max(0.0, delay - (time.monotonic() - started)))

    logs.event(log, "stopping", "stopping on a signal", reason="signal")
    server.shutdown()
    server.server_close()
    auditor.close()
    return ExitStatus.SUCCESS


def _label_clash(keys: list[str]) -> str | None:
    """Two ``--pod-label`` keys that export as one Prometheus label name, said in one line; None when all differ."""
    from .metrics import label_name

    seen: dict[str, str] = {}
    for key in keys:
        other = seen.setdefault(label_name(key), key)
        if other != key:
            return (
                f"--pod-label {other} and --pod-label {key} both become the metric label {label_name(key)}; "
                "keep one of them"
            )
    return None


def _count_degraded(snapshot: NodeSnapshot, metrics: Any) -> None:
    """A cycle that completed with a degraded source still counts that source's failure."""
    if any(note.startswith("NVML:") for note in snapshot.notes):
        metrics.failed("nvml")
    if any(note.startswith("Kubernetes API unavailable") for note in snapshot.notes):
        metrics.failed("kubernetes-api")
