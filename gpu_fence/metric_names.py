"""The auditor's series as Prometheus stores them: what the exporter writes and chargeback's PromQL reads.

Pure. ``gpu_fence.auditor.metrics`` exports the series under these names and labels (``docs/metrics.md`` describes
each); ``gpu_fence.chargeback`` queries them (its raw series, its recording rules, the recorded sums). Naming them
once here keeps the two in step without the bill importing the node's auditor.
"""

from __future__ import annotations

import re

# Per container on a GPU or MIG device (labels: CONTAINER_LABELS, gpu_uuid; memory and activity also allocated).
CONTAINER_MEMORY = "gpu_fence_container_gpu_memory_bytes"
CONTAINER_ALLOCATED = "gpu_fence_container_allocated_gpus"
CONTAINER_UNKNOWN_MEMORY = "gpu_fence_container_gpu_processes_unknown_memory"
CONTAINER_SM_ACTIVITY = "gpu_fence_container_gpu_sm_activity_ratio"
CONTAINER_MEMORY_CONTROLLER_ACTIVITY = "gpu_fence_container_gpu_memory_controller_activity_ratio"
CONTAINER_ENCODER_ACTIVITY = "gpu_fence_container_gpu_encoder_activity_ratio"
CONTAINER_DECODER_ACTIVITY = "gpu_fence_container_gpu_decoder_activity_ratio"
CONTAINER_UNRESOLVED_DRA = "gpu_fence_container_unresolved_dra_devices"  # labels: CONTAINER_LABELS, driver, reason
OVERREACH_FINDINGS = "gpu_fence_overreach_findings"  # labels: CONTAINER_LABELS, kind
# Per GPU or MIG device (labels: node, gpu_uuid).
UNATTRIBUTED_MEMORY = "gpu_fence_unattributed_gpu_memory_bytes"
UNATTRIBUTED_UNKNOWN_MEMORY = "gpu_fence_unattributed_gpu_processes_unknown_memory"
GPU_PROCESSES_UNKNOWN = "gpu_fence_gpu_processes_unknown"  # also reason
GPU_INFO = "gpu_fence_gpu_info"  # labels: GPU_INFO_LABELS
GPU_MEMORY_TOTAL = "gpu_fence_gpu_memory_total_bytes"
GPU_SHARE = "gpu_fence_gpu_share_ratio"
GPU_ACTIVITY_SAMPLED = "gpu_fence_gpu_activity_sampled"
GPU_ACTIVITY_UNKNOWN = "gpu_fence_gpu_activity_unknown"  # also reason
GPU_OFFERED_REPLICAS = "gpu_fence_gpu_offered_replicas"
# Per pod: the labels chosen with --pod-label (labels: namespace, pod, and label_name of each key).
POD_LABELS = "gpu_fence_pod_labels"

CONTAINER_LABELS = ("node", "namespace", "pod", "container")
GPU_INFO_LABELS = ("node", "gpu_uuid", "parent_uuid", "model", "mig_profile")

_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def label_name(key: str) -> str:
    """``--pod-label`` key → Prometheus label name: ``app.kubernetes.io/team`` → ``label_app_kubernetes_io_team``."""
    return "label_" + _LABEL_CHARS.sub("_", key)
