"""The hand-checked chargeback scenarios as OpenMetrics for a real Prometheus, and a way to run the command.

Each scenario lives in its own one-hour window, on its own nodes, two days in the past (backfilled blocks must
be older than the head block), with a sample every 60 s. The tests query each window with ``--step 10m``: six
intervals of 600 s, so a one-hour window is exactly one billed hour. A series whose last sample is at
``+29 min`` is still seen at ``+30 min`` (Prometheus' 5-minute lookback) and not at ``+40 min``: it counts for
exactly the first half hour.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field

from jsonschema import Draft202012Validator, FormatChecker

from gpu_fence import chargeback
from gpu_fence.chargeback import make
from gpu_fence.chargeback.bill import Bill
from gpu_fence.chargeback.provenance import Provenance
from gpu_fence.chargeback.render import bill_schema

GIB = 1 << 30
HOUR = 3600
STEP = 60
H100 = "NVIDIA H100 80GB HBM3"
A100_80 = "NVIDIA A100-SXM4-80GB"
A100_40 = "NVIDIA A100-SXM4-40GB"
T4 = "Tesla T4"

PRICES_YAML = f"""\
currency: EUR
default: 2.50
models:
  "{H100}": 4.00
  "{A100_80}": 3.00
  "{A100_40}": 7.00
nodes:
  "cheap-*": 1.00
"""

# dcgm-exporter beside the auditor, one window per way it labels a shared card (see dcgm_scenarios).
DCGM_WINDOWS = ("dcgm-default", "dcgm-virtual", "dcgm-virtual-copies", "dcgm-mps", "dcgm-mig")

# Two and a half days ago (the last window still hours before now), aligned to the 2-hour TSDB block boundary.
BASE = int(time.time()) // 7200 * 7200 - 60 * HOUR


@dataclass(frozen=True)
class Window:
    start: int
    end: int


WINDOWS = {
    name: Window(BASE + index * 3 * HOUR, BASE + index * 3 * HOUR + HOUR)
    for index, name in enumerate(
        [
            "exclusive",
            "timeslice",
            "mig",
            "overreach",
            "renamed",
            "held-idle",
            "replicas",
            "replicas-unknown",
            "mig-idle",
            "relabelled",
            "dra-unknown",
            "unrecorded",
            *DCGM_WINDOWS,
        ]
    )
}

# The recording rules (``rules.py``), evaluated every 10 minutes as the scenarios are billed, over every window but
# the second half hour of "unrecorded": there the rules recorded nothing, as when Prometheus was down.
RULES_INTERVAL = 600
UNRECORDED = (WINDOWS["unrecorded"].start + 30 * 60, WINDOWS["unrecorded"].start + 60 * 60)
RECORDED_RANGES = (
    (BASE - HOUR, UNRECORDED[0]),
    (UNRECORDED[1], WINDOWS[DCGM_WINDOWS[-1]].end + 2 * HOUR),
)


@dataclass
class OpenMetrics:
    families: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def series(self, name: str, labels: dict[str, str], value: float, start: int, end: int) -> None:
        """``value`` every STEP seconds from ``start`` to ``end`` inclusive."""
        rendered = ",".join(f'{key}="{val}"' for key, val in labels.items())
        self.families[name] += [f"{name}{{{rendered}}} {value} {ts}" for ts in range(start, end + 1, STEP)]

    def text(self) -> str:
        out = []
        for name, lines in self.families.items():
            out.append(f"# TYPE {name} gauge")
            out += lines
        return "\n".join([*out, "# EOF", ""])


def card(om: OpenMetrics, window: Window, node: str, uuid: str, model: str, *, offered: int | None = 1) -> None:
    """A whole GPU; ``offered`` is what gpu_fence_gpu_offered_replicas says (None: the auditor exported none)."""
    labels = {"node": node, "gpu_uuid": uuid, "parent_uuid": "", "model": model, "mig_profile": ""}
    om.series("gpu_fence_gpu_info", labels, 1, window.start, window.end)
    om.series("gpu_fence_gpu_share_ratio", {"node": node, "gpu_uuid": uuid}, 1, window.start, window.end)
    if offered is not None:
        om.series("gpu_fence_gpu_offered_replicas", {"node": node, "gpu_uuid": uuid}, offered, window.start, window.end)


def mig(om: OpenMetrics, window: Window, node: str, parent: str, uuid: str, *, model: str, slices: int) -> None:
    labels = {
        "node": node,
        "gpu_uuid": uuid,
        "parent_uuid": parent,
        "model": f"{model} MIG {slices}g.{slices * 5}gb",
        "mig_profile": f"{slices}g.{slices * 5}gb",
    }
    om.series("gpu_fence_gpu_info", labels, 1, window.start, window.end)
    om.series("gpu_fence_gpu_share_ratio", {"node": node, "gpu_uuid": uuid}, slices / 7, window.start, window.end)
    om.series("gpu_fence_gpu_offered_replicas", {"node": node, "gpu_uuid": uuid}, 1, window.start, window.end)


def mig_3_2_2(om: OpenMetrics, window: Window, node: str, parent: str, slices: tuple[str, str, str]) -> None:
    """An A100 40GB card split into a 3g and two 2g slices (3/7, 2/7, 2/7 of the card); 1/7 stays unpartitioned."""
    card(om, window, node, parent, A100_40)
    for uuid, size in zip(slices, (3, 2, 2), strict=True):
        mig(om, window, node, parent, uuid, model=A100_40, slices=size)


def container(
    om: OpenMetrics,
    window: Window,
    node: str,
    uuid: str,
    *,
    namespace: str,
    pod: str,
    gib: float,
    allocated: bool = True,
    until: int | None = None,
    replicas: int = 1,
) -> None:
    """A container holding ``replicas`` allocation ids on ``uuid`` all window (when ``allocated``) and ``gib`` of
    memory on it until ``until``; ``gib=0`` is a holder that never puts memory on the device."""
    who = {"node": node, "namespace": namespace, "pod": pod, "container": "main", "gpu_uuid": uuid}
    end = window.end if until is None else until
    if gib > 0:
        om.series(
            "gpu_fence_container_gpu_memory_bytes",
            {**who, "allocated": str(allocated).lower()},
            gib * GIB,
            window.start,
            end,
        )
    if allocated:
        om.series("gpu_fence_container_allocated_gpus", who, replicas, window.start, window.end)


def scenarios() -> str:
    om = OpenMetrics()
    # Exclusive: two H100 (4.00/h). team-a uses GPU-e1 all hour; team-b uses GPU-e2 only for the first half hour.
    w = WINDOWS["exclusive"]
    card(om, w, "excl", "GPU-e1", H100)
    card(om, w, "excl", "GPU-e2", H100)
    container(om, w, "excl", "GPU-e1", namespace="team-a", pod="train", gib=40)
    container(om, w, "excl", "GPU-e2", namespace="team-b", pod="infer", gib=10, until=w.start + 29 * 60)

    # Time-slicing: one A100 80GB (3.00/h), three replicas, 6 / 2 / 4 GiB; pod c carries no team label.
    w = WINDOWS["timeslice"]
    card(om, w, "ts", "GPU-t", A100_80, offered=3)
    container(om, w, "ts", "GPU-t", namespace="ml", pod="a", gib=6)
    container(om, w, "ts", "GPU-t", namespace="ml", pod="b", gib=2)
    container(om, w, "ts", "GPU-t", namespace="research", pod="c", gib=4)
    # SM activity, never billed: a at 50 % all hour, b at 10 % for the first half hour, c sampled and idle.
    for pod, namespace, ratio, until in (
        ("a", "ml", 0.5, w.end),
        ("b", "ml", 0.1, w.start + 29 * 60),
        ("c", "research", 0.0, w.end),
    ):
        who = {"node": "ts", "namespace": namespace, "pod": pod, "container": "main", "gpu_uuid": "GPU-t"}
        om.series("gpu_fence_container_gpu_sm_activity_ratio", {**who, "allocated": "true"}, ratio, w.start, until)
    # The auditor also exports label app (--pod-label app), which the recording rules do not roll up.
    for pod, team in (("a", "alpha"), ("b", "beta")):
        labels = {"namespace": "ml", "pod": pod, "label_example_com_team": team, "label_app": "trainer"}
        om.series("gpu_fence_pod_labels", labels, 1, w.start, w.end)

    # MIG: one A100 40GB (7.00/h) split 3g / 2g / 2g; the second 2g slice is used for the first half hour only.
    w = WINDOWS["mig"]
    mig_3_2_2(om, w, "mig", "GPU-m", ("MIG-m3", "MIG-m2a", "MIG-m2b"))
    container(om, w, "mig", "MIG-m3", namespace="vision", pod="p3", gib=10)
    container(om, w, "mig", "MIG-m2a", namespace="nlp", pod="p2a", gib=5)
    container(om, w, "mig", "MIG-m2b", namespace="nlp", pod="p2b", gib=1, until=w.start + 29 * 60)

    # Overreach: a T4 (no model price → default 2.50/h) shared by its allocated pod (3 GiB), a pod with no
    # allocation (1 GiB) and a host process (4 GiB); a second T4 on a "cheap-*" node (1.00/h) nobody uses.
    w = WINDOWS["overreach"]
    card(om, w, "over", "GPU-o", T4)
    card(om, w, "cheap-7", "GPU-idle", T4)
    container(om, w, "over", "GPU-o", namespace="batch", pod="legit", gib=3)
    container(om, w, "over", "GPU-o", namespace="sneaky", pod="miner", gib=1, allocated=False)
    om.series("gpu_fence_unattributed_gpu_memory_bytes", {"node": "over", "gpu_uuid": "GPU-o"}, 4 * GIB, w.start, w.end)

    # Scraped without honor_labels: Prometheus kept the auditor pod's own namespace/pod/container target labels
    # and renamed the workload's to exported_*. Billing it would charge everything to the auditor's namespace.
    w = WINDOWS["renamed"]
    card(om, w, "renamed", "GPU-r", T4)
    om.series(
        "gpu_fence_container_gpu_memory_bytes",
        {
            "node": "renamed",
            "namespace": "gpu-fence",
            "pod": "gpu-fence-auditor-x7k2p",
            "container": "auditor",
            "exported_namespace": "ml",
            "exported_pod": "train",
            "exported_container": "main",
            "gpu_uuid": "GPU-r",
            "allocated": "true",
        },
        2 * GIB,
        w.start,
        w.end,
    )
    held_idle_scenarios(om)
    recorded_scenarios(om)
    dcgm_scenarios(om)
    return om.text()


def recorded_scenarios(om: OpenMetrics) -> None:
    """Windows that matter for the recording rules: a pod whose team label changes, a window the rules missed."""
    # A time-sliced A100 80GB (3.00/h, 3 replicas): pod ml/x changes team after +31 min (each interval goes to the
    # team it carried then: alpha is seen at +30 min and beta from +40), ml/y carries no team label ("(none)").
    w = WINDOWS["relabelled"]
    card(om, w, "relabel", "GPU-l", A100_80, offered=3)
    container(om, w, "relabel", "GPU-l", namespace="ml", pod="x", gib=6)
    container(om, w, "relabel", "GPU-l", namespace="ml", pod="y", gib=2)
    label = "label_example_com_team"
    om.series("gpu_fence_pod_labels", {"namespace": "ml", "pod": "x", label: "alpha"}, 1, w.start, w.start + 31 * 60)
    om.series("gpu_fence_pod_labels", {"namespace": "ml", "pod": "x", label: "beta"}, 1, w.start + 32 * 60, w.end)
    dra_unknown_scenario(om)
    # The replicas scenario again, on its own node: the rules recorded its first half hour only.
    w = WINDOWS["unrecorded"]
    card(om, w, "ts4-gap", "GPU-g4", A100_80, offered=4)
    container(om, w, "ts4-gap", "GPU-g4", namespace="lab", pod="active", gib=4, until=w.start + 29 * 60)
    container(om, w, "ts4-gap", "GPU-g4", namespace="queue", pod="waiting", gib=0, replicas=2)


def dra_unknown_scenario(om: OpenMetrics) -> None:
    """Memory beside a DRA device the auditor could not resolve (``allocated="unknown"``): the container's usage,
    never overreach. Node ``dra`` has two cards at two prices, an H100 (4.00/h) and a T4 (default 2.50/h)."""
    w = WINDOWS["dra-unknown"]
    card(om, w, "dra", "GPU-d1", H100)
    card(om, w, "dra", "GPU-d2", T4)
    # infer/claim holds a DRA device whose UUID no ResourceSlice gives; its 6 GiB on GPU-d1 may be that device.
    who = {"node": "dra", "namespace": "infer", "pod": "claim", "container": "main"}
    om.series(
        "gpu_fence_container_unresolved_dra_devices",
        {**who, "driver": "gpu.nvidia.com", "reason": "no-uuid"},
        1,
        w.start,
        w.end,
    )
    om.series(
        "gpu_fence_container_gpu_memory_bytes",
        {**who, "gpu_uuid": "GPU-d1", "allocated": "unknown"},
        6 * GIB,
        w.start,
        w.end,
    )
    # lab/train holds GPU-d1 by the kubelet and uses 2 GiB there: the card splits 6 : 2. Nobody touches GPU-d2.
    container(om, w, "dra", "GPU-d1", namespace="lab", pod="train", gib=2)


def held_idle_scenarios(om: OpenMetrics) -> None:
    """What an allocation blocks, its holder pays: devices held with no memory in use."""
    # Two H100 (4.00/h) held all hour by one pod that never allocates memory on them; a third nobody holds.
    w = WINDOWS["held-idle"]
    for uuid in ("GPU-h1", "GPU-h2", "GPU-h3"):
        card(om, w, "held", uuid, H100)
    container(om, w, "held", "GPU-h1", namespace="team-idle", pod="waiting", gib=0)
    container(om, w, "held", "GPU-h2", namespace="team-idle", pod="waiting", gib=0)

    # An A100 80GB (3.00/h) time-sliced into 4 replicas: lab/active holds one and uses 4 GiB for the first half
    # hour; queue/waiting holds two and never uses them; the fourth replica nobody holds.
    for name, offered in (("replicas", 4), ("replicas-unknown", None)):
        w = WINDOWS[name]
        node = "ts4" if offered else "ts-unknown"
        card(om, w, node, "GPU-r4", A100_80, offered=offered)
        container(om, w, node, "GPU-r4", namespace="lab", pod="active", gib=4, until=w.start + 29 * 60)
        container(om, w, node, "GPU-r4", namespace="queue", pod="waiting", gib=0, replicas=2)

    # An A100 40GB (7.00/h) split 3g / 2g / 2g: infer uses the 3g slice all hour; hold holds both 2g slices idle.
    w = WINDOWS["mig-idle"]
    mig_3_2_2(om, w, "mig-idle", "GPU-mi", ("MIG-i3", "MIG-i2a", "MIG-i2b"))
    container(om, w, "mig-idle", "MIG-i3", namespace="infer", pod="serve", gib=8)
    container(om, w, "mig-idle", "MIG-i2a", namespace="hold", pod="reserve-a", gib=0)
    container(om, w, "mig-idle", "MIG-i2b", namespace="hold", pod="reserve-b", gib=0)


def dcgm(
    om: OpenMetrics,
    window: Window,
    field: str,
    value: float,
    *,
    hostname: str,
    uuid: str,
    model: str,
    who: dict[str, str] | None = None,
    mig: tuple[str, int] | None = None,
    old_namespace: bool = False,
    node_label: str = "Hostname",
) -> None:
    """One dcgm-exporter series, labelled as its GPU template writes them (dcgm-exporter 4.5.3-4.8.2,
    internal/pkg/rendermetrics/render_metrics.go:47): gpu, UUID (uuid with --use-old-namespace), pci_bus_id, device,
    modelName, GPU_I_PROFILE and GPU_I_ID on a MIG instance, Hostname ("hostname" from commit d5e5f51 on), the
    default label counter DCGM_FI_DRIVER_VERSION, then the pod mapping's labels (``who``)."""
    labels = {
        "gpu": "0",
        "uuid" if old_namespace else "UUID": uuid,
        "pci_bus_id": "00000000:07:00.0",
        "device": "nvidia0",
        "modelName": model,
    }
    if mig is not None:
        labels |= {"GPU_I_PROFILE": mig[0], "GPU_I_ID": str(mig[1])}
    labels |= {node_label: hostname, "DCGM_FI_DRIVER_VERSION": "570.133.20", **(who or {})}
    om.series(field, labels, value, window.start, window.end)


def pod_of(namespace: str, pod: str, *, vgpu: int | None = None, old_namespace: bool = False) -> dict[str, str]:
    """The labels dcgm-exporter's pod mapping adds (transformation/kubernetes.go): pod, namespace, container (or
    pod_name, pod_namespace, container_name); in --kubernetes-virtual-gpus mode the replica as vgpu, and on the
    per-process series pod_uid."""
    if old_namespace:
        labels = {"pod_name": pod, "pod_namespace": namespace, "container_name": "main"}
    else:
        labels = {"pod": pod, "namespace": namespace, "container": "main"}
    if vgpu is not None:
        labels |= {"pod_uid": f"uid-{namespace}-{pod}", "vgpu": str(vgpu)}
    return labels


THREE_PODS = (("ml", "a", 6), ("ml", "b", 2), ("research", "c", 4))  # GiB each on one time-sliced A100 80GB
SM_PERCENT = {"a": 50, "b": 10, "c": 30}  # each pod's processes' SM utilisation; the device's is 90 %


def dcgm_scenarios(om: OpenMetrics) -> None:
    """dcgm-exporter's series beside the auditor's, for the comparison (--compare-device-metrics).

    Three time-sliced windows hold the same card as "timeslice" (an A100 80GB at 3.00/h, three replicas, pods of
    6, 2 and 4 GiB: this bill ml 2.00, research 1.00), each labelled as one dcgm-exporter mode labels it."""
    for name, node in (("dcgm-default", "ts-d"), ("dcgm-virtual", "ts-v"), ("dcgm-virtual-copies", "ts-c")):
        w = WINDOWS[name]
        card(om, w, node, "GPU-t", A100_80, offered=3)
        for namespace, pod, gib in THREE_PODS:
            container(om, w, node, "GPU-t", namespace=namespace, pod=pod, gib=gib)
    device = {"uuid": "GPU-t", "model": A100_80}

    # Default mode: every replica maps the card to a pod, and the last one wins (kubernetes.go, toDeviceToPod):
    # each series carries one pod, research/c here, with the device's whole value.
    w = WINDOWS["dcgm-default"]
    dcgm(om, w, "DCGM_FI_DEV_FB_USED", 12 * 1024, hostname="ts-d", **device, who=pod_of("research", "c"))
    dcgm(om, w, "DCGM_FI_DEV_GPU_UTIL", 90, hostname="ts-d", **device, who=pod_of("research", "c"))

    # --kubernetes-virtual-gpus, 4.5.3-4.8.2 on: FB_USED and GPU_UTIL are per-process values summed per pod
    # (process_metrics.go, isPerProcessMetric), beside the original device series; every other field is copied
    # once per sharing pod (kubernetes.go, Process).
    w = WINDOWS["dcgm-virtual"]
    dcgm(om, w, "DCGM_FI_DEV_FB_USED", 12 * 1024, hostname="ts-v", **device)
    dcgm(om, w, "DCGM_FI_DEV_GPU_UTIL", 90, hostname="ts-v", **device)
    for replica, (namespace, pod, gib) in enumerate(THREE_PODS):
        who = pod_of(namespace, pod, vgpu=replica)
        dcgm(om, w, "DCGM_FI_DEV_FB_USED", gib * 1024, hostname="ts-v", **device, who=who)
        dcgm(om, w, "DCGM_FI_DEV_GPU_UTIL", SM_PERCENT[pod], hostname="ts-v", **device, who=who)
        dcgm(om, w, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.9, hostname="ts-v", **device, who=who)
        dcgm(om, w, "DCGM_FI_DEV_POWER_USAGE", 310.5, hostname="ts-v", **device, who=who)

    # --kubernetes-virtual-gpus before 4.5.3-4.8.2: every field, FB_USED and GPU_UTIL too, copied once per pod.
    w = WINDOWS["dcgm-virtual-copies"]
    for replica, (namespace, pod, _) in enumerate(THREE_PODS):
        who = pod_of(namespace, pod, vgpu=replica)
        dcgm(om, w, "DCGM_FI_DEV_FB_USED", 12 * 1024, hostname="ts-c", **device, who=who)
        dcgm(om, w, "DCGM_FI_DEV_GPU_UTIL", 90, hostname="ts-c", **device, who=who)

    # MPS: an H100 (4.00/h) offered as two replicas, train/x 20 GiB and infer/y 10 GiB (this bill: 2.67 and 1.33).
    # dcgm-exporter after d5e5f51 ("hostname"), virtual mode. Under MPS the driver gives every per-process
    # utilisation sample to the MPS server's pid (measured on an H200, docs/gpu-smoke.md), which runs in no pod
    # that holds the card: each client pod's per-process sum is 0 while the device is 80 % busy.
    w = WINDOWS["dcgm-mps"]
    card(om, w, "mps", "GPU-p", H100, offered=2)
    mps = {"uuid": "GPU-p", "model": H100, "hostname": "mps", "node_label": "hostname"}
    dcgm(om, w, "DCGM_FI_DEV_GPU_UTIL", 80, **mps)
    for replica, (namespace, pod, gib, sm) in enumerate((("train", "x", 20, 0), ("infer", "y", 10, 0))):
        container(om, w, "mps", "GPU-p", namespace=namespace, pod=pod, gib=gib)
        who = pod_of(namespace, pod, vgpu=replica)
        dcgm(om, w, "DCGM_FI_DEV_FB_USED", gib * 1024, **mps, who=who)
        dcgm(om, w, "DCGM_FI_DEV_GPU_UTIL", sm, **mps, who=who)

    # MIG: the "mig" window's card (an A100 40GB at 7.00/h, 3g / 2g / 2g; vision on the 3g, nlp on both 2g, one
    # of them used for the first half hour only), with --use-old-namespace labels. One series per GPU instance,
    # labelled with the pod that holds it; no GPU_UTIL, which dcgm-exporter does not export for MIG instances.
    w = WINDOWS["dcgm-mig"]
    mig_3_2_2(om, w, "mig-d", "GPU-md", ("MIG-d3", "MIG-d2a", "MIG-d2b"))
    container(om, w, "mig-d", "MIG-d3", namespace="vision", pod="p3", gib=10)
    container(om, w, "mig-d", "MIG-d2a", namespace="nlp", pod="p2a", gib=5)
    container(om, w, "mig-d", "MIG-d2b", namespace="nlp", pod="p2b", gib=1, until=w.start + 29 * 60)
    for namespace, pod, profile, instance, mib in (
        ("vision", "p3", "3g.20gb", 1, 10 * 1024),
        ("nlp", "p2a", "2g.10gb", 5, 5 * 1024),
        ("nlp", "p2b", "2g.10gb", 6, 1024),
    ):
        who = pod_of(namespace, pod, old_namespace=True)
        dcgm(
            om,
            w,
            "DCGM_FI_DEV_FB_USED",
            mib,
            hostname="mig-d",
            uuid="GPU-md",
            model=A100_40,
            who=who,
            mig=(profile, instance),
            old_namespace=True,
        )


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str


def run_chargeback(*argv: str) -> Result:
    """Run ``gpu-fence-auditor chargeback ARGV`` in process through the subcommand's own argparse wiring.

    Every JSON bill it writes (to stdout or ``--output``) is checked against the published schema on the way.
    """
    parser = argparse.ArgumentParser(prog="gpu-fence-auditor")
    chargeback.add_arguments(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["chargeback", *argv])
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = args.run(args)
    if code == 0 and args.format == "json":
        validate_bill(json.loads(args.output.read_text(encoding="utf-8") if args.output else stdout.getvalue()))
    return Result(code, stdout.getvalue(), stderr.getvalue())


def bill_and_provenance(*argv: str) -> tuple[Bill, Provenance]:
    """The bill ``gpu-fence-auditor chargeback ARGV`` would write, before it is rendered (``make.render``
    writes it in any format)."""
    parser = argparse.ArgumentParser(prog="gpu-fence-auditor")
    chargeback.add_arguments(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["chargeback", *argv])
    return make.make_bill(chargeback.settings_from(args, float(int(time.time()))))


def validate_bill(document: dict) -> dict:
    """Raise unless ``document`` satisfies ``bill.schema.json``; returns it, for chaining."""
    Draft202012Validator(bill_schema(), format_checker=FormatChecker()).validate(document)
    return document


def made(step: float = 60.0, group_by: str = "namespace") -> Provenance:
    """A provenance for renderer tests that build a bill by hand."""
    return Provenance(
        generated_at=1_800_000_000.0,
        version="0.0.0-test",
        source="http://prometheus:9090",
        step=step,
        group_by=group_by,
    )


def window_args(name: str, series: str = "raw") -> list[str]:
    """A window billed as six 10-minute intervals from its start, from the raw series by default: the instants
    the hand-checked figures are worked out at (the recording rules evaluate at their own phase)."""
    window = WINDOWS[name]
    return ["--start", str(window.start), "--end", str(window.end), "--step", "10m", "--series", series]
