"""The names the KAI scheduler gives its GPU sharing, and the defaults gpu-fence assumes for them.

A KAI fractional pod requests no ``nvidia.com/gpu``: it carries a fraction annotation, is scheduled by KAI, and a
reservation pod in KAI's reservation namespace holds the whole GPU it shares. The webhook trusts the annotation only
under a KAI ``schedulerName``; the auditor finds the shared GPU through the reservation pods. Both deployables take
the defaults from here (each can be configured otherwise), as KAI names them in
``pkg/common/constants/constants.go`` (NVIDIA/KAI-Scheduler, commit dafd3d81): ``DefaultSchedulerName``,
``DefaultResourceReservationName``, ``GpuFraction``, ``GpuMemory`` and ``GpuFractionContainerName``.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_RESERVATION_NAMESPACE",
    "DEFAULT_SCHEDULER_NAMES",
    "FRACTION_ANNOTATIONS",
    "FRACTION_CONTAINER_ANNOTATION",
]

#: ``schedulerName`` values of the pods KAI schedules.
DEFAULT_SCHEDULER_NAMES: tuple[str, ...] = ("kai-scheduler",)
#: Where KAI runs the reservation pods that hold the GPUs its fractional pods share.
DEFAULT_RESERVATION_NAMESPACE = "kai-resource-reservation"
#: Pod annotations by which a pod asks KAI for a fraction of a GPU (by share, or by memory).
FRACTION_ANNOTATIONS = ("gpu-fraction", "gpu-memory")
#: The pod annotation that names the container holding the fraction (else the first container).
FRACTION_CONTAINER_ANNOTATION = "gpu-fraction-container-name"
