"""What the auditor asks the kubelet's PodResources API and why a call may fail, as the metrics label them.

Kept apart from the client so that the metrics can name every label value up front without importing gRPC.
"""

SOCKET_MISSING = "socket-missing"
CONNECTION_REFUSED = "connection-refused"
PERMISSION_DENIED = "permission-denied"
TIMEOUT = "timeout"
UNIMPLEMENTED = "unimplemented"
RATE_LIMITED = "rate-limited"
UNAVAILABLE = "unavailable"
ERROR = "error"
REASONS = (
    SOCKET_MISSING,
    CONNECTION_REFUSED,
    PERMISSION_DENIED,
    TIMEOUT,
    UNIMPLEMENTED,
    RATE_LIMITED,
    UNAVAILABLE,
    ERROR,
)

#: The methods the auditor calls (``Get`` is not one of them), as ``calls`` and ``failures`` name them.
METHODS = ("List", "GetAllocatableResources")
