"""The settings of ``once`` and ``run``: their flags, each default written once (as a field default here), and
the frozen values a started auditor reads instead of ``argparse``.

``AuditSettings`` is what both commands share: where each source is, and the flags that change names and verdicts.
``RunSettings`` adds the loop's: interval, metrics address, health window, Events, backoff. Flags are checked as
they are parsed (``--interval 0`` is a usage error), and :func:`label_clash` checks what no single flag can.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from gpu_fence import kai
from gpu_fence.command_line import positive
from gpu_fence.kubeconfig import ORDER as KUBECONFIG_ORDER
from gpu_fence.metric_names import label_name

from .dra import DEFAULT_GPU_DRIVERS
from .offered import DEFAULT_INTERVAL as DEFAULT_ALLOCATABLE_INTERVAL
from .podresources import DEFAULT_SOCKET
from .report import FORMATS

_positive = positive(float, "number")

ONCE_EXAMPLES = """\
examples:
  gpu-fence-auditor once --format json --exempt-namespace gpu-operator
  gpu-fence-auditor once --host-proc /host/proc --nvml-lib /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1
  gpu-fence-auditor once --no-kubernetes --format junit --output audit.xml

exit codes: 0 clean, 1 findings, 2 could not audit (the reason is printed on stderr)
"""

RUN_EXAMPLES = """\
examples:
  gpu-fence-auditor run --interval 30 --metrics-port 10400 --exempt-namespace gpu-operator
  gpu-fence-auditor run --host-proc /host/proc --pod-label team --pod-label app.kubernetes.io/part-of

/healthz answers 503 when no cycle succeeded for --unhealthy-after intervals; exits 0 on SIGTERM.
"""


@dataclass(frozen=True)
class AuditSettings:
    """Where each source is and how to name and judge what they show: what ``once`` and ``run`` share."""

    node: str  # --node, else $NODE_NAME, else the host name
    pod_resources_socket: str = DEFAULT_SOCKET
    host_proc: str = "/proc"
    nvml_lib: str | None = None  # None: the library path's libnvidia-ml.so.1
    kubeconfig: str | None = None  # None: $KUBECONFIG, ~/.kube/config, then the in-cluster service account
    kubernetes: bool = True  # False: --no-kubernetes
    exempt_namespaces: frozenset[str] = frozenset()
    pod_label_keys: tuple[str, ...] = ()
    kai_reservation_namespace: str = kai.DEFAULT_RESERVATION_NAMESPACE
    kai_scheduler_names: tuple[str, ...] = kai.DEFAULT_SCHEDULER_NAMES
    pod_relist_interval: float = 60.0
    dra_gpu_drivers: tuple[str, ...] = DEFAULT_GPU_DRIVERS
    allocatable_interval: float = DEFAULT_ALLOCATABLE_INTERVAL

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AuditSettings:
        return cls(
            node=args.node or socket.gethostname(),
            pod_resources_socket=args.pod_resources_socket,
            host_proc=args.host_proc,
            nvml_lib=args.nvml_lib,
            kubeconfig=args.kubeconfig,
            kubernetes=not args.no_kubernetes,
            exempt_namespaces=frozenset(args.exempt_namespace),
            pod_label_keys=tuple(args.pod_label),
            kai_reservation_namespace=args.kai_reservation_namespace,
            kai_scheduler_names=tuple(args.kai_scheduler_name or cls.kai_scheduler_names),
            pod_relist_interval=args.pod_relist_interval,
            dra_gpu_drivers=tuple(dict.fromkeys(args.dra_gpu_driver or cls.dra_gpu_drivers)),
            allocatable_interval=args.allocatable_interval,
        )


@dataclass(frozen=True)
class RunSettings:
    """The loop of ``run``: how often, where ``/metrics`` and ``/healthz`` are served, Events, backoff."""

    audit: AuditSettings
    interval: float = 30.0
    metrics_port: int = 10400  # not dcgm-exporter's 9400 (docs/metrics.md)
    metrics_bind: str = "0.0.0.0"  # noqa: S104 - a DaemonSet's metrics are scraped from other pods
    web_config_file: str | None = None  # None: plain HTTP
    unhealthy_after: int = 3
    event_interval: float = 60.0  # minutes
    events: bool = True  # False: --no-events
    max_backoff: float = 300.0
    debug: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunSettings:
        return cls(
            audit=AuditSettings.from_args(args),
            interval=args.interval,
            metrics_port=args.metrics_port,
            metrics_bind=args.metrics_bind,
            web_config_file=args.web_config_file,
            unhealthy_after=args.unhealthy_after,
            event_interval=args.event_interval,
            events=not args.no_events,
            max_backoff=args.max_backoff,
            debug=args.debug,
        )


def add_once_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The ``once`` subcommand's parser; the caller sets the function it runs."""
    once = subparsers.add_parser(
        "once",
        help="audit this node once and print the report",
        description="Audit every container on this node once: allocated vs visible vs used GPUs.",
        epilog=ONCE_EXAMPLES,
    )
    _add_audit_arguments(once)
    once.add_argument("--format", choices=FORMATS, default="text", help="report format (default: text)")
    once.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout")
    return once


def add_run_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The ``run`` subcommand's parser; the caller sets the function it runs."""
    run = subparsers.add_parser(
        "run",
        help="audit this node in a loop; serve /metrics and /healthz; post Events",
        description="Audit this node every --interval seconds, export metrics and post GPUOverreach Events.",
        epilog=RUN_EXAMPLES,
    )
    _add_audit_arguments(run)
    run.add_argument(
        "--interval",
        type=_positive,
        default=RunSettings.interval,
        metavar="S",
        help=f"seconds between cycles (default: {RunSettings.interval:g})",
    )
    run.add_argument(
        "--metrics-port",
        type=_port,
        default=RunSettings.metrics_port,
        metavar="P",
        help=f"port of /metrics and /healthz (default: {RunSettings.metrics_port}; 0 picks a free one)",
    )
    run.add_argument(
        "--metrics-bind",
        default=RunSettings.metrics_bind,
        metavar="ADDR",
        help=f"address to serve on (default: {RunSettings.metrics_bind})",
    )
    run.add_argument(
        "--web-config-file",
        metavar="FILE",
        help="serve over TLS, with optional client certificates, as FILE says (the Prometheus exporter-toolkit "
        "web.config shape: tls_server_config; docs/metrics.md); default: plain HTTP",
    )
    run.add_argument(
        "--unhealthy-after",
        type=int,
        default=RunSettings.unhealthy_after,
        metavar="N",
        help="/healthz fails when the last successful cycle is older than N intervals "
        f"(default: {RunSettings.unhealthy_after})",
    )
    run.add_argument(
        "--event-interval",
        type=_positive,
        default=RunSettings.event_interval,
        metavar="MIN",
        help="re-emit the Event of a finding that persists at most every MIN minutes "
        f"(default: {RunSettings.event_interval:g})",
    )
    run.add_argument("--no-events", action="store_true", help="do not post Kubernetes Events")
    run.add_argument(
        "--max-backoff",
        type=_positive,
        default=RunSettings.max_backoff,
        metavar="S",
        help=f"longest wait after repeated failed cycles (default: {RunSettings.max_backoff:g})",
    )
    return run


def _add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pod-resources-socket",
        default=AuditSettings.pod_resources_socket,
        metavar="P",
        help=f"kubelet PodResources socket (default: {AuditSettings.pod_resources_socket})",
    )
    parser.add_argument(
        "--host-proc",
        default=AuditSettings.host_proc,
        metavar="DIR",
        help=f"host proc root (default: {AuditSettings.host_proc}; /host/proc in the DaemonSet)",
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
        help=f"kubeconfig file (default: {KUBECONFIG_ORDER})",
    )
    parser.add_argument(
        "--no-kubernetes",
        action="store_true",
        help="do not use the Kubernetes API: names from PodResources, tied to containers by their GPU use; no Events",
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
        default=AuditSettings.kai_reservation_namespace,
        metavar="NS",
        help=f"namespace of KAI's GPU reservation pods (default: {AuditSettings.kai_reservation_namespace})",
    )
    parser.add_argument(
        "--kai-scheduler-name",
        action="append",
        default=None,
        metavar="NAME",
        help="schedulerName of KAI fractional pods (repeatable; default: "
        f"{', '.join(AuditSettings.kai_scheduler_names)})",
    )
    parser.add_argument(
        "--pod-relist-interval",
        type=_positive,
        default=AuditSettings.pod_relist_interval,
        metavar="S",
        help=f"relist this node's pods at least every S seconds (default: {AuditSettings.pod_relist_interval:g})",
    )
    parser.add_argument(
        "--dra-gpu-driver",
        action="append",
        default=None,
        metavar="NAME",
        help="a DRA driver whose devices are GPUs, resolved to UUIDs through this node's ResourceSlices "
        f"(repeatable; default: {', '.join(AuditSettings.dra_gpu_drivers)}); other drivers' devices are not audited",
    )
    parser.add_argument(
        "--allocatable-interval",
        type=_positive,
        default=AuditSettings.allocatable_interval,
        metavar="S",
        help="ask the kubelet which device ids its device plugins offer (GetAllocatableResources) at start and then "
        f"every S seconds (default: {AuditSettings.allocatable_interval:g})",
    )


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return int(text)


def label_clash(keys: Iterable[str]) -> str | None:
    """Two ``--pod-label`` keys that export as one Prometheus label name, said in one line; None when all differ."""
    seen: dict[str, str] = {}
    for key in keys:
        other = seen.setdefault(label_name(key), key)
        if other != key:
            return (
                f"--pod-label {other} and --pod-label {key} both become the metric label {label_name(key)}; "
                "keep one of them"
            )
    return None
