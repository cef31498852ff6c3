"""The ``once`` and ``run`` subcommands: audit this node one time, or forever with metrics, health and Events.

``once`` prints the report and exits 0 (clean), 1 (findings) or 2 (could not audit, one line saying why).
``run`` loops every ``--interval`` seconds, serves ``/metrics`` and ``/healthz``, posts deduplicated Events, and
survives every per-cycle failure (kubelet down or restarting, NVML errors, a lost GPU, the API server down, a
process exiting mid-read) with exponential backoff, counting each in ``gpu_fence_audit_cycle_failures_total``.
It exits 0 on SIGTERM/SIGINT.

One :class:`Auditor` holds the sources across cycles and runs one cycle at a time (``auditor.collect``, then the
pure ``auditor.audit``). The flags and their defaults live in ``auditor.settings``, the HTTP server in
``auditor.server``. NVML, gRPC, the ``kubernetes`` client and prometheus_client are imported inside functions so
``--help`` stays fast.
"""

# ruff: noqa: PLC0415  (heavy imports are deferred on purpose, see the module docstring)
from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_fence import logs
from gpu_fence.exit_status import ExitStatus

from .audit import audit
from .collect import CollectError, collect
from .model import AuditPolicy, AuditResult, FailureReason, NodeSnapshot
from .podresources.calls import KubeletFailure, KubeletMethod
from .report import render
from .server import Health, serve_http
from .settings import AuditSettings, RunSettings, add_once_parser, add_run_parser, label_clash
from .snapshot import SnapshotOptions
from .sources import HostProcSource, NvmlSource, OfferedSource, PodResourcesSource, PodSource, SliceSource, Sources
from .webconfig import TlsContexts, WebConfigError, load_web_config

if TYPE_CHECKING:
    from .kube import ApiBudget, KubeClient
    from .metrics import AuditorMetrics


def add_arguments(subparsers: Any) -> None:
    add_once_parser(subparsers).set_defaults(run=run_once)
    add_run_parser(subparsers).set_defaults(run=run_daemon)


# --- one auditor, shared by once and run -----------------------------------------------------------------


class Auditor:
    """Holds the sources across cycles and runs one cycle at a time.

    A source that failed a cycle (the kubelet, NVML) is closed and opened afresh by the next one: a restarted
    kubelet listens on a new socket, a re-initialised NVML sees GPUs that came back. ``watch``: keep the
    ResourceSlices current on a background watch (``run``); without it they are listed once, when opened (``once``).
    """

    def __init__(self, settings: AuditSettings, *, watch: bool = False) -> None:
        self.settings = settings
        self.node = settings.node
        self.watch = watch
        self.options = SnapshotOptions(
            node=self.node,
            pod_label_keys=settings.pod_label_keys,
            kai_reservation_namespace=settings.kai_reservation_namespace,
            kai_scheduler_names=settings.kai_scheduler_names,
            gpu_dra_drivers=frozenset(settings.dra_gpu_drivers),
        )
        self.policy = AuditPolicy(
            exempt_namespaces=settings.exempt_namespaces,
            kai_reservation_namespace=settings.kai_reservation_namespace,
        )
        self.api_client: KubeClient | None = None
        self.api_problem: str | None = None
        #: how long the Kubernetes API calls may wait; ``run`` bounds each cycle's calls together (``api_budget``)
        self.api_budget: ApiBudget | None = None
        self._hostproc: HostProcSource | None = None
        self._pods: PodSource | None = None
        self._slices: SliceSource | None = None
        self._offered: OfferedSource | None = None
        self._podresources: PodResourcesSource | None = None
        self._nvml: NvmlSource | None = None
        #: PodResources RPCs made, by method, over every client this auditor built (one is rebuilt per outage).
        self.kubelet_calls: Counter[KubeletMethod] = Counter()
        #: PodResources RPCs that failed, by (method, reason), over the same clients.
        self.kubelet_failures: Counter[tuple[KubeletMethod, KubeletFailure]] = Counter()
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
        from .hostproc import HostProc

        if not HostProc(self.settings.host_proc).root_is_directory():
            raise CollectError(
                FailureReason.PROC,
                f"host proc root {self.settings.host_proc} is not a directory (mount the host's "
                "/proc and pass --host-proc)",
            )
        if self.settings.kubernetes:
            from .kube import ApiBudget, KubernetesUnavailable, load_api_client

            self.api_budget = ApiBudget()
            try:
                self.api_client = load_api_client(self.settings.kubeconfig, budget=self.api_budget)
            except KubernetesUnavailable as error:
                self.api_problem = error.reason

    def sources(self) -> Sources:
        """The sources of the next cycle, opening those not open (raises ``CollectError`` when one cannot open)."""
        if self._hostproc is None:
            from .hostproc import HostProc
            from .kube import PodCache
            from .offered import OfferedReplicas

            self._hostproc = HostProc(self.settings.host_proc)
            self._offered = OfferedReplicas(self.settings.allocatable_interval)
            if self.api_client is not None:
                self._pods = PodCache(self.api_client, self.node, relist_interval=self.settings.pod_relist_interval)
                self._slices = self._open_slices(self.api_client)
        if self._podresources is None:
            self._podresources = self._open_podresources()
        if self._nvml is None:
            self._nvml = self._open_nvml()
        return Sources(self._podresources, self._nvml, self._hostproc, self._pods, self._slices, self._offered)

    def _open_slices(self, api_client: KubeClient) -> SliceSource:
        """The node's ResourceSlices: listed now (bounded by the API client's timeout), then watched with ``watch``."""
        from .resourceslices import ResourceSliceCache

        slices = ResourceSliceCache(api_client, self.node, drivers=self.settings.dra_gpu_drivers)
        slices.sync()
        if self.watch:
            slices.start()
        return slices

    def _open_podresources(self) -> PodResourcesSource:
        socket_path = self.settings.pod_resources_socket
        if not os.path.exists(socket_path):
            raise CollectError(
                FailureReason.KUBELET,
                f"kubelet PodResources socket {socket_path} does not exist (mount /var/lib/kubelet/pod-resources "
                "from the host, or pass --pod-resources-socket)",
            )
        from .podresources.client import PodResourcesClient

        return PodResourcesClient(socket_path, calls=self.kubelet_calls, failures=self.kubelet_failures)

    def _open_nvml(self) -> NvmlSource:
        from .nvml import Nvml, NvmlError

        nvml = Nvml(self.settings.nvml_lib)
        try:
            nvml.open()
        except NvmlError as error:
            raise CollectError(FailureReason.NVML, str(error)) from error
        return nvml

    def cycle(self) -> tuple[NodeSnapshot, AuditResult]:
        self.cycles += 1
        if self.cycles == 2:
            self._freeze_long_lived()
        try:
            snapshot = collect(self.sources(), self.options)
        except CollectError as error:
            self._restart(error.source)
            raise
        if self.api_problem:
            snapshot = snapshot.with_degraded(
                FailureReason.KUBERNETES_API, f"Kubernetes API unavailable: {self.api_problem}"
            )
        return snapshot, audit(snapshot, self.policy)

    def _restart(self, source: FailureReason) -> None:
        """Close the adapter of a source that failed, so that the next cycle opens it afresh."""
        if source is FailureReason.KUBELET:
            adapter: PodResourcesSource | NvmlSource | None = self._podresources
            self._podresources = None
        elif source is FailureReason.NVML:
            adapter = self._nvml
            self._nvml = None
        else:
            return
        if adapter is not None:
            with contextlib.suppress(Exception):  # closing a broken adapter has nothing left to report
                adapter.close()

    def close(self) -> None:
        self._restart(FailureReason.KUBELET)
        self._restart(FailureReason.NVML)
        if self._slices is not None:
            self._slices.close()
            self._slices = None


# --- once ------------------------------------------------------------------------------------------------


def run_once(args: argparse.Namespace) -> ExitStatus:
    auditor = Auditor(AuditSettings.from_args(args))
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


def api_budget(interval: float, window: float) -> float:
    """Seconds the Kubernetes API calls of one cycle may take together (the pod list and the Events).

    A cycle starts at most ``interval`` after the last one ended; if every API call of it hangs, it must still end
    before ``/healthz`` turns unhealthy, ``window`` after that last success: the calls get half of what is left
    once the interval is waited (the other half is for the cycle's own work), at most one call's own bound, and at
    least a fraction of the interval (a window of one interval leaves nothing, and health flaps anyway).
    """
    from .kube import API_CALL_SECONDS

    return min(API_CALL_SECONDS, max((window - interval) / 2, min(1.0, interval / 2)))


def backoff(interval: float, failures_in_row: int, maximum: float) -> float:
    """Wait before the next cycle: the interval, doubled per consecutive failure, capped."""
    if failures_in_row <= 0:
        return interval
    # The exponent is bounded: 2**n of a days-long outage would overflow a float and end the loop.
    return min(interval * 2.0 ** min(failures_in_row - 1, 64), max(maximum, interval))


def run_daemon(args: argparse.Namespace) -> ExitStatus:
    from .kube import EventRecorder
    from .metrics import AuditorMetrics

    # gRPC's C core logs to stderr in its own format (a kubelet restart prints a GOAWAY line); our JSON lines say
    # what matters, so silence it unless the operator asks for it.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    logs.configure("INFO")  # JSON lines on stderr, the shape the webhook's serve writes too
    settings = RunSettings.from_args(args)
    clash = label_clash(settings.audit.pod_label_keys)
    if clash:
        print(f"gpu-fence-auditor run: {clash}", file=sys.stderr)
        return ExitStatus.ERROR
    tls = None
    if settings.web_config_file is not None:
        try:
            tls = TlsContexts(load_web_config(settings.web_config_file))
        except WebConfigError as error:
            print(f"gpu-fence-auditor run: --web-config-file {error}", file=sys.stderr)
            return ExitStatus.ERROR
    auditor = Auditor(settings.audit, watch=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        auditor.preflight()
    except CollectError as error:
        print(f"gpu-fence-auditor run: cannot start: {error.reason}", file=sys.stderr)
        return ExitStatus.ERROR
    health = Health(settings.interval, settings.unhealthy_after)
    # The per-container series go stale with /healthz: an audit older than the health window is no measurement.
    metrics = AuditorMetrics(auditor.node, settings.audit.pod_label_keys, stale_after=health.window)
    try:
        server = serve_http(settings.metrics_bind, settings.metrics_port, metrics, health, tls)
    except OSError as error:
        print(
            f"gpu-fence-auditor run: cannot serve on {settings.metrics_bind}:{settings.metrics_port}: {error.strerror}",
            file=sys.stderr,
        )
        return ExitStatus.ERROR
    events = None
    if auditor.api_client is not None and settings.events:
        events = EventRecorder(auditor.api_client, auditor.node, reemit_after=settings.event_interval * 60)
    port = server.server_address[1]
    budget = api_budget(settings.interval, health.window)
    logs.event(
        log,
        "started",
        f"auditing node {auditor.node}, serving /metrics and /healthz on port {port}" + (" over TLS" if tls else ""),
        node=auditor.node,
        port=port,
        tls=tls is not None,
        interval=settings.interval,
        api_budget_seconds=round(budget, 3),
        kubernetes=auditor.api_client is not None,
        problem=auditor.api_problem,
    )

    failures_in_row = 0
    while not stop.is_set():
        started = time.monotonic()
        if auditor.api_budget is not None:
            auditor.api_budget.renew(budget)
        try:
            snapshot, result = auditor.cycle()
        except Exception as error:  # a CollectError names the source that failed; anything else is ours
            failures_in_row += 1
            if isinstance(error, CollectError):
                source, message, level, trace = error.source, error.reason, logging.WARNING, None
                metrics.sync_kubelet_calls(auditor.kubelet_calls, auditor.kubelet_failures)
            else:
                source, message, level = FailureReason.INTERNAL, f"internal error: {error}", logging.ERROR
                trace = error if settings.debug else None
            health.last_error = message
            metrics.failed(source)
            logs.event(
                log,
                "cycle-failed",
                message,
                level=level,
                exc_info=trace,
                reason=source.value,
                failures_in_row=failures_in_row,
            )
        else:
            failures_in_row = 0
            duration = time.monotonic() - started
            metrics.observe(snapshot, result, duration)
            metrics.sync_kubelet_calls(auditor.kubelet_calls, auditor.kubelet_failures)
            health.last_success = time.time()
            _count_degraded(snapshot, metrics)
            written = 0
            if events is not None:
                failures_before = events.failures
                written = events.record(result.findings)
                if events.failures > failures_before:
                    metrics.failed(FailureReason.KUBERNETES_API)
            logs.event(
                log,
                "cycle",
                f"audited {len(result.rows)} containers: {len(result.findings)} findings",
                node=snapshot.node,
                duration_seconds=round(duration, 4),
                containers=len(result.rows),
                findings=len(result.findings),
                identity=snapshot.identity_source.value,
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
                    namespace=finding.ref.namespace,
                    pod=finding.ref.pod,
                    container=finding.ref.container,
                    gpu=finding.gpu,
                    pid=finding.pid,
                    memory_bytes=finding.memory_bytes,
                )
            # Not kept while the next cycle builds its own: two node-sized snapshots would meet at the RSS peak.
            del snapshot, result
        delay = backoff(settings.interval, failures_in_row, settings.max_backoff)
        stop.wait(max(0.0, delay - (time.monotonic() - started)))

    logs.event(log, "stopping", "stopping on a signal", reason="signal")
    server.shutdown()
    server.server_close()
    auditor.close()
    return ExitStatus.SUCCESS


def _count_degraded(snapshot: NodeSnapshot, metrics: AuditorMetrics) -> None:
    """A cycle that completed with a degraded source still counts that source's failure."""
    for reason in FailureReason:
        if reason in snapshot.degraded:
            metrics.failed(reason)
