"""The verdict names: one outcome, seen from the pod and from one admission answer.

:class:`Verdict` is what the policy decides for one pod spec, mutate then validate, as a whole: the offline check
reports it for every pod spec it finds (text, json, junit, sarif) and ``webhook.policy.Decision`` computes it.

:class:`ReviewVerdict` is what one AdmissionReview answer did, at one endpoint: the ``verdict`` label of
``gpu_fence_webhook_reviews_total`` and the ``verdict`` field of the review log line. The API server calls the
mutating endpoint, then the validating one on the mutated pod, so a pod's verdict is the sum of its answers:

=========== ================ ================ =================
``Verdict`` ``/mutate``      ``/validate``    ``/validate/warn``
=========== ================ ================ =================
allowed     allowed          allowed          allowed
mutated     patched          allowed          allowed
rejected    patched/allowed  denied           warned
exempt      exempt           exempt           exempt
=========== ================ ================ =================

and ``error``, a policy that raised, has no pod verdict: the answer fails closed on ``/validate`` and open on the
other two (``webhook.review``). Both are ``StrEnum``: a member is its name wherever text is written.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ReviewVerdict", "Verdict"]


class Verdict(StrEnum):
    """The policy's verdict on one pod spec, in the order the check's summaries list them."""

    ALLOWED = "allowed"  # nothing to change, nothing broken
    MUTATED = "mutated"  # pinned, then valid
    REJECTED = "rejected"  # some rule broken after mutation
    EXEMPT = "exempt"  # admitted untouched (namespace, service account, mirror pod)


class ReviewVerdict(StrEnum):
    """What one admission answer did."""

    ALLOWED = "allowed"  # nothing to do (also: not a pod, not an operation the webhook judges)
    PATCHED = "patched"
    DENIED = "denied"
    WARNED = "warned"
    EXEMPT = "exempt"
    ERROR = "error"  # internal error: denied on /validate, allowed elsewhere
