"""``--compare-device-metrics``: the bill a device-metric method makes from dcgm-exporter's series, beside this one.

dcgm-exporter labels each GPU's series with the pod it maps there (``pod``, ``namespace``; ``pod_name``,
``pod_namespace`` with ``--use-old-namespace``). Two methods are built from them, for the same range, instants and
prices as the bill (``docs/chargeback.md``, "Device metrics against this bill"):

- **device-hours**: each pod a device's ``DCGM_FI_DEV_FB_USED`` series names pays that device (its card's price,
  a MIG instance its share of it) for the interval: what "GPU-hours per pod" from device series comes to;
- **utilisation**: each pod a device's ``DCGM_FI_DEV_GPU_UTIL`` series names pays the device × that value / 100.

Pure but for :func:`fetch_device_metrics`, which only runs the two queries.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpu_fence.metric_names import label_name

from .comparison import DeviceMetricBill, DeviceMetricGroup
from .errors import ChargebackError
from .prometheus import Series, Source
from .raw import NO_LABEL, GroupOf, instant_key, pod_groups, pod_labels_query
from .times import iso

FB_USED = "DCGM_FI_DEV_FB_USED"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
# dcgm-exporter's spellings (4.5.3-4.8.2): the node is "Hostname" there and "hostname" from the next commit on
# (d5e5f51); the card "UUID", or "uuid" with --use-old-namespace; the pod's labels as above. A Prometheus that
# scraped it without honor_labels keeps the exporter pod's own namespace/pod and renames the workload's exported_*.
NODE_LABELS = ("Hostname", "hostname")
UUID_LABELS = ("UUID", "uuid")
NAMESPACE_LABELS = ("exported_namespace", "namespace", "pod_namespace")
POD_LABELS = ("exported_pod", "pod", "pod_name")
_BY = ", ".join((*NODE_LABELS, *UUID_LABELS, "modelName", "GPU_I_PROFILE", "GPU_I_ID", *NAMESPACE_LABELS, *POD_LABELS))
# A GPU instance profile ("3g.40gb", "1g.10gb+me") names its compute slices; the card has 7 (A100, H100, H200,
# B200), the A30 4 (NVIDIA's MIG user guide, "Supported MIG Profiles").
_PROFILE = re.compile(r"^(\d+)g\.")
_FOUR_SLICE_MODELS = ("A30",)


def device_query(metric: str) -> str:
    """One series per device and pod: a pod's containers (and replicas, ``vgpu``) on one device count once."""
    return f"max by ({_BY}) ({metric})"


def _first(labels: Mapping[str, str], names: Sequence[str]) -> str:
    return next((labels[name] for name in names if labels.get(name)), "")


def _mig_share(profile: str, model: str) -> float | None:
    found = _PROFILE.match(profile)
    if found is None:
        return None
    slices = 4 if any(name in model for name in _FOUR_SLICE_MODELS) else 7
    return min(1.0, int(found.group(1)) / slices)


@dataclass
class _Pricer:
    """Prices dcgm-exporter's series at the bill's instants; remembers what it could not price."""

    slots: Mapping[int, float]
    hours: float
    price_of: Callable[[str, str], float | None]
    group_of: GroupOf
    unpriced: set[tuple[str, str]] = field(default_factory=set)
    unknown_profiles: set[str] = field(default_factory=set)

    def charges(self, series: Sequence[Series], weight: Callable[[float], float]) -> dict[str, float]:
        """group → Σ over instants of (the device's cost of the interval × weight(value)), a pod once per device."""
        seen: dict[tuple[int, str, str, str, str, str], float] = {}
        for item in series:
            labels = item.labels
            namespace, pod = _first(labels, NAMESPACE_LABELS), _first(labels, POD_LABELS)
            if not pod:
                continue  # a device series with no pod mapped to it: nobody to bill
            node, uuid, model = _first(labels, NODE_LABELS), _first(labels, UUID_LABELS), labels.get("modelName", "")
            profile, instance = labels.get("GPU_I_PROFILE", ""), labels.get("GPU_I_ID", "")
            share = _mig_share(profile, model) if profile else 1.0
            if share is None:
                self.unknown_profiles.add(profile)
                continue
            price = self.price_of(node, model)
            if price is None:
                self.unpriced.add((node, model))
                continue
            for ts, value in item.values:
                key = instant_key(ts)
                if key not in self.slots or not math.isfinite(value) or value < 0:
                    continue
                where = (key, node, uuid, instance, namespace, pod)
                seen[where] = max(seen.get(where, 0.0), price * share * self.hours * weight(value))
        totals: dict[str, float] = defaultdict(float)
        for (key, _, _, _, namespace, pod), cost in seen.items():
            totals[self.group_of(namespace, pod, key)] += cost
        return totals


def device_metric_bill(
    instants: Sequence[float],
    step: float,
    *,
    fb_used: Sequence[Series],
    gpu_util: Sequence[Series],
    price_of: Callable[[str, str], float | None],
    group_of: GroupOf,
    gpu_fence: Mapping[str, float],
    gpu_fence_rest: float,
    real_cost: float,
) -> DeviceMetricBill:
    """Both device-metric bills over the instants (each standing for the ``step`` before it), per group.

    ``gpu_fence``: this bill's total per group; ``gpu_fence_rest``: its cost outside the groups; ``real_cost``: the
    cards' cost over the range. Raises ChargebackError when a device's model and node have no price."""
    pricer = _Pricer({instant_key(instant): instant for instant in instants}, step / 3600.0, price_of, group_of)
    by_presence = pricer.charges(fb_used, lambda _: 1.0)
    by_utilisation = pricer.charges(gpu_util, lambda value: min(value, 100.0) / 100.0)
    if pricer.unpriced:
        node, model = sorted(pricer.unpriced)[0]
        raise ChargebackError(
            f"--compare-device-metrics: no price for dcgm-exporter's GPU model {model!r} on node {node!r} "
            f"({len(pricer.unpriced)} model/node pair(s) unpriced): add it under models: or nodes:, or set default:"
        )
    notes = []
    if not any(_first(item.labels, POD_LABELS) for item in fb_used):
        notes.append(
            f"no {FB_USED} series carries a pod label: dcgm-exporter labels pods only with the kubelet's "
            "pod-resources socket mounted; both device-metric bills are empty"
        )
    if any(item.labels.get("GPU_I_PROFILE") for item in fb_used) and not any(
        item.labels.get("GPU_I_PROFILE") for item in gpu_util
    ):
        notes.append(
            f"dcgm-exporter does not support {GPU_UTIL} for MIG instances: the utilisation method bills them nothing"
        )
    if pricer.unknown_profiles:
        notes.append(
            f"MIG profile(s) {', '.join(sorted(pricer.unknown_profiles))} name no compute slices: not billed by the "
            "device-metric methods"
        )
    names = list(gpu_fence) + sorted((set(by_presence) | set(by_utilisation)) - set(gpu_fence))
    groups = tuple(
        DeviceMetricGroup(name, gpu_fence.get(name, 0.0), by_presence.get(name, 0.0), by_utilisation.get(name, 0.0))
        for name in names
    )
    return DeviceMetricBill(groups, gpu_fence_rest, real_cost, tuple(notes))


def fetch_device_metrics(
    source: Source, instants: Sequence[float], step: float, by: str
) -> tuple[list[Series], list[Series], GroupOf]:
    """dcgm-exporter's memory and utilisation series at the bill's instants (``step`` apart), and the pods' groups
    (with ``label:KEY``, the auditor's pod labels at each instant, as the bill groups them); an error when
    dcgm-exporter has no series there."""
    first, last = instants[0], instants[-1]
    fb_used = source.query_range(device_query(FB_USED), first, last, step)
    if not any(item.values for item in fb_used):
        raise ChargebackError(
            f"--compare-device-metrics: no {FB_USED} series at {source.name} between {iso(first - step)} and "
            f"{iso(last)}: check that this Prometheus scrapes dcgm-exporter"
        )
    gpu_util = source.query_range(device_query(GPU_UTIL), first, last, step)
    if by == "namespace":

        def group_of(namespace: str, pod: str, key: int) -> str:
            return namespace or NO_LABEL

        return fb_used, gpu_util, group_of
    label = label_name(by.removeprefix("label:"))
    groups = pod_groups(source.query_range(pod_labels_query(label), first, last, step), label)

    def group_of_label(namespace: str, pod: str, key: int) -> str:
        return groups.get((key, namespace, pod), NO_LABEL)

    return fb_used, gpu_util, group_of_label
