"""The admission policy: pin ``NVIDIA_VISIBLE_DEVICES=void`` on containers with no GPU, reject other GPU paths.

Pure functions over the Pod as a plain dict (as JSON-decoded from the AdmissionReview or read from YAML). They
never raise on malformed input and never modify it: what cannot be read is treated conservatively (a container
whose ``env`` is not a list cannot be pinned, so it is a violation) and a decision is always returned.

Reading order: the values returned, the rule table, how a pod is read, one function per rule (named after its
rule id), then ``mutate``, ``validate``, ``validate_update`` (a plain pod UPDATE), ``exemption`` and ``evaluate``,
which chains them as the offline check does. The GPU vocabulary (what is a GPU request, what a
``NVIDIA_VISIBLE_DEVICES`` value means) lives in ``gpu_fence.vocabulary``, KAI's names in ``gpu_fence.kai``, host
path matching in ``webhook.host_paths``; the rule ids and their vectors are those of ``docs/policy.md`` and
``docs/threat-model.md``.

Who gets pinned: every container that requests no device-plugin GPU resource. A DRA claim does not spare a
container the pin (the claim may be for any device class, and NVIDIA's CDI specs set ``void`` themselves), and
neither does being KAI's fraction container (KAI's webhook replaces the pin with its ConfigMap reference).
"""

from __future__ import annotations

from ..config import CDI_ANNOTATION_PREFIXES
from ..host_paths import clean_path
from .admission import evaluate, exemption, mutate, validate, validate_update
from .patch import apply_patch
from .rules import RULE_CHECKS
from .values import (
    ADDED_CAPABILITY,
    BOUND_GPU_POD,
    CDI_ANNOTATION,
    DEVICE_LIST_MOUNT,
    GATED_DEVICE_ENV,
    GPU_ENV_FROM,
    HOST_DEVICE_PATH,
    HOST_IPC,
    HOST_PATH,
    HOST_PID,
    HOST_PROCESS,
    IMEX_CHANNELS,
    KAI_ANNOTATION_UPDATE,
    MIG_CONTROL_ENV,
    MIRROR_POD_ANNOTATION,
    NO_MUTATION,
    NO_VIOLATIONS,
    NVIDIA_RUNTIME_CLASS,
    PIN_VALUE,
    PRIVILEGED,
    RULES,
    RUNTIME_ANNOTATION,
    SYS_ADMIN_CAPABILITY,
    UNPINNED_CONTAINER,
    UPDATE_RULES,
    VISIBLE_DEVICES,
    VISIBLE_DEVICES_NONE,
    VOLUME_TYPE,
    Decision,
    Mutation,
    Reach,
    Rule,
    Validation,
    Violation,
)

__all__ = [
    "ADDED_CAPABILITY",
    "BOUND_GPU_POD",
    "CDI_ANNOTATION",
    "CDI_ANNOTATION_PREFIXES",
    "DEVICE_LIST_MOUNT",
    "GATED_DEVICE_ENV",
    "GPU_ENV_FROM",
    "HOST_DEVICE_PATH",
    "HOST_IPC",
    "HOST_PATH",
    "HOST_PID",
    "HOST_PROCESS",
    "IMEX_CHANNELS",
    "KAI_ANNOTATION_UPDATE",
    "MIG_CONTROL_ENV",
    "MIRROR_POD_ANNOTATION",
    "NO_MUTATION",
    "NO_VIOLATIONS",
    "NVIDIA_RUNTIME_CLASS",
    "PIN_VALUE",
    "PRIVILEGED",
    "RULES",
    "RULE_CHECKS",
    "RUNTIME_ANNOTATION",
    "SYS_ADMIN_CAPABILITY",
    "UNPINNED_CONTAINER",
    "UPDATE_RULES",
    "VISIBLE_DEVICES",
    "VISIBLE_DEVICES_NONE",
    "VOLUME_TYPE",
    "Decision",
    "Mutation",
    "Reach",
    "Rule",
    "Validation",
    "Violation",
    "apply_patch",
    "clean_path",
    "evaluate",
    "exemption",
    "mutate",
    "validate",
    "validate_update",
]
