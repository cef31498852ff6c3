"""The names the KAI scheduler gives its GPU sharing, and the defaults gpu-fence assumes for them.

A KAI fractional pod requests no ``nvidia.com/gpu``: it carries a fraction annotation, is scheduled by KAI, and a
reservation pod in KAI's reservation namespace holds the whole GPU it shares. The webhook trusts the annotation only
under a KAI ``schedulerName``; the auditor finds the shared GPU through the reservation pods. Both deployables take
the defaults from here (each can be configured otherwise), as KAI names them in
``pkg/common/constants/constants.go`` (NVIDIA/KAI-Scheduler, commit dafd3d81): ``DefaultSchedulerName``,
``DefaultResourceReservationName``, ``GpuFraction``, ``GpuMemory`` and ``GpuFractionContainerName``.

KAI's admission webhook hands the fraction container its GPU through ConfigMaps it names after a prefix kept in a pod
annotation; the binder fills them when it binds the pod. The webhook accepts that reference only in the shape KAI
writes, so the names live here too (kai-scheduler/KAI-Scheduler, commit d5bc503a:
``pkg/binder/common/gpusharingconfigmap/config_map.go`` ``SetGpuCapabilitiesConfigMapName``,
``generateConfigMapNamePrefix``, ``ExtractCapabilitiesConfigMapName``, ``ExtractDirectEnvVarsConfigMapName``).
"""

from __future__ import annotations

import re

__all__ = [
    "BIND_TIME_ANNOTATIONS",
    "DEFAULT_RESERVATION_NAMESPACE",
    "DEFAULT_SCHEDULER_NAMES",
    "FRACTION_ANNOTATIONS",
    "FRACTION_CONTAINER_ANNOTATION",
    "GPU_GROUP_LABEL",
    "MULTI_GPU_GROUP_LABEL_PREFIX",
    "SHARED_GPU_CONFIG_MAP_ANNOTATION",
    "SHARED_GPU_CONFIG_MAP_PREFIX",
    "capabilities_config_map",
    "direct_env_config_map",
]

#: ``schedulerName`` values of the pods KAI schedules.
DEFAULT_SCHEDULER_NAMES: tuple[str, ...] = ("kai-scheduler",)
#: Where KAI runs the reservation pods that hold the GPUs its fractional pods share.
DEFAULT_RESERVATION_NAMESPACE = "kai-resource-reservation"
#: The pod label by which KAI's binder ties a fraction pod to the reservation pod that holds its GPU (on both), and
#: the prefix of the one label per GPU a multi-GPU fraction pod carries (``<prefix><group>``): ``GPUGroup`` and
#: ``MultiGpuGroupLabelPrefix`` in KAI's ``pkg/common/constants/constants.go``.
GPU_GROUP_LABEL = "runai-gpu-group"
MULTI_GPU_GROUP_LABEL_PREFIX = GPU_GROUP_LABEL + "/"
#: Pod annotations by which a pod asks KAI for a fraction of a GPU (by share, or by memory).
FRACTION_ANNOTATIONS = ("gpu-fraction", "gpu-memory")
#: The pod annotation that names the container holding the fraction (else the first container).
FRACTION_CONTAINER_ANNOTATION = "gpu-fraction-container-name"
#: The pod annotation that holds the prefix of the fraction container's ConfigMap names. KAI's webhook writes it,
#: unless the pod already carries it.
SHARED_GPU_CONFIG_MAP_ANNOTATION = "runai/shared-gpu-configmap"
#: The prefix as KAI generates it: the owner's (or the pod's) name, cut and trimmed, seven characters of
#: apimachinery's ``rand.String`` (its alphabet: ``bcdfghjklmnpqrstvwxz2456789``), then ``shared-gpu``.
SHARED_GPU_CONFIG_MAP_PREFIX = re.compile(r"[a-z0-9.-]*-[bcdfghjklmnpqrstvwxz2456789]{7}-shared-gpu")
#: The pod annotations KAI's binder reads when it binds a fraction pod, to decide whether it fills a ConfigMap and
#: which one (``pkg/binder/plugins/gpusharing/gpu_sharing.go`` PreBind, ``pkg/binder/common/gpu_access.go``
#: ``GetFractionContainerRef``, ``gpusharingconfigmap.ExtractCapabilitiesConfigMapName``), while the fraction
#: container's reference was written from them at creation. KAI itself sets none of them after creation: its
#: webhook is registered for CREATE only (``pkg/operator/operands/admission/resources.go``), its binder patches
#: ``received-resource-type`` and ``kai.scheduler/numa-placement-predicted`` (``pkg/binder/binding/binder.go``),
#: its pod grouper ``pod-group-name`` (``pkg/podgrouper/pod_controller.go``).
BIND_TIME_ANNOTATIONS: tuple[str, ...] = (
    *FRACTION_ANNOTATIONS,
    FRACTION_CONTAINER_ANNOTATION,
    SHARED_GPU_CONFIG_MAP_ANNOTATION,
)


def capabilities_config_map(prefix: str, *, init: bool, index: int) -> str:
    """The ConfigMap whose ``NVIDIA_VISIBLE_DEVICES`` key the binder sets for the fraction container, the
    ``index``-th of the pod's init containers or containers."""
    return f"{prefix}-{'i' if init else ''}{index}"


def direct_env_config_map(prefix: str, *, init: bool, index: int) -> str:
    """The ConfigMap KAI's webhook adds to the fraction container's ``envFrom``."""
    return capabilities_config_map(prefix, init=init, index=index) + "-evar"
