"""What the auditor asks the kubelet's PodResources API and why a call may fail, as the metrics label them.

Kept apart from the client so that the metrics can name every label value up front without importing gRPC. Both
are ``StrEnum``: a member is the label value itself, so the client's counters, the metrics and the logs all write it
as it is.
"""

from __future__ import annotations

from enum import StrEnum


class KubeletMethod(StrEnum):
    """A PodResources v1 method, by its gRPC name: the ``method`` label."""

    LIST = "List"
    GET_ALLOCATABLE_RESOURCES = "GetAllocatableResources"
    GET = "Get"


class KubeletFailure(StrEnum):
    """Why a PodResources call failed: ``KubeletUnavailable.reason`` and the ``reason`` label."""

    SOCKET_MISSING = "socket-missing"
    CONNECTION_REFUSED = "connection-refused"
    PERMISSION_DENIED = "permission-denied"
    TIMEOUT = "timeout"
    UNIMPLEMENTED = "unimplemented"
    RATE_LIMITED = "rate-limited"
    UNAVAILABLE = "unavailable"
    ERROR = "error"


#: The methods the auditor calls (``Get`` is not one of them), as ``calls`` and ``failures`` name them.
METHODS = (KubeletMethod.LIST, KubeletMethod.GET_ALLOCATABLE_RESOURCES)
