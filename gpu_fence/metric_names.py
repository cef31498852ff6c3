"""The auditor's series as Prometheus stores them: what the exporter writes and chargeback's PromQL reads.

Pure. ``gpu_fence.auditor.metrics`` exports the series under these names and labels; ``gpu_fence.chargeback`` queries
them (its raw series, its recording rules, the recorded sums, the device-metric comparison). Naming them once here
keeps the two in step without the bill importing the node's auditor.
"""

from __future__ import annotations

import re

_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def label_name(key: str) -> str:
    """``--pod-label`` key → Prometheus label name: ``app.kubernetes.io/team`` → ``label_app_kubernetes_io_team``."""
    return "label_" + _LABEL_CHARS.sub("_", key)
