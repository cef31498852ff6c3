"""Which pods can land on a GPU node: the optional scope of the rules that guard the node (``gpu_node_taints``).

Pure. Where every GPU node carries a configured ``NoSchedule`` or ``NoExecute`` taint from the moment it registers,
a pod that tolerates none of those taints can run only elsewhere: a privileged container there reaches no GPU and
not the node that holds them, which is Pod Security's business, not gpu-fence's. The answer rests only on what the
API server shows admission, and every input a pod author controls counts against the pod:

* ``spec.nodeName`` set: the pod skips the scheduler, and the kubelet checks only ``NoExecute`` taints when it
  admits a pod (kubernetes ``pkg/kubelet/lifecycle/predicate.go``, ``generalFilter``), so it may run on a GPU node;
* ``spec.runtimeClassName`` set: the RuntimeClass admission plugin merges the class's ``scheduling.tolerations``
  into the pod before any webhook runs, but ``check`` reads manifests that never met it;
* a ``schedulerName`` (empty means ``default-scheduler``) not in ``taint_aware_schedulers``: a scheduler that is not
  known to honour taints may place the pod anywhere;
* a toleration that tolerates any configured taint, by the API's own rules (``ToleratesTaint`` in kubernetes
  ``staging/src/k8s.io/api/core/v1/toleration.go``): an empty effect matches every effect, an empty key every key
  (``operator: Exists`` with no key tolerates everything), ``Exists`` every value, ``Equal`` (or no operator) the
  same value; an operator gpu-fence does not know (``Lt``, ``Gt``, a later one), or an entry it cannot read, counts
  as tolerating.

Tolerations are the one part of a created pod's scheduling that its author can extend later (an UPDATE may add
tolerations), so ``webhook.policy.validate_update`` judges an update that brings a pod into scope, and the webhook
configurations send such updates. docs/policy.md ("Scope: GPU nodes") states what must hold for this to be sound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import GpuTaint, PolicyConfig

__all__ = ["DEFAULT_SCHEDULER", "reaches_gpu_nodes", "tolerates"]

#: The scheduler a pod with no ``schedulerName`` gets (the API server defaults the field to it).
DEFAULT_SCHEDULER = "default-scheduler"
_KNOWN_OPERATORS = frozenset({"", "Equal", "Exists"})


def tolerates(toleration: Any, taint: GpuTaint) -> bool:
    """Whether one toleration entry tolerates the taint; an entry that cannot be read tolerates (fail closed)."""
    if not isinstance(toleration, Mapping):
        return True
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    operator, value = toleration.get("operator") or "", toleration.get("value") or ""
    if not all(isinstance(field, str) for field in (effect, key, operator, value)):
        return True
    if operator not in _KNOWN_OPERATORS:
        return True
    if effect and effect != taint.effect:
        return False
    if key and key != taint.key:
        return False
    return operator == "Exists" or value == taint.value


def reaches_gpu_nodes(spec: Mapping[str, Any], config: PolicyConfig) -> bool:
    """Whether a pod with this spec can run on a node that carries one of the configured GPU taints. With no taints
    configured, every pod can (the scope is off)."""
    taints = config.gpu_node_taints
    if not taints:
        return True
    if spec.get("nodeName") or spec.get("runtimeClassName"):
        return True
    scheduler = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if not isinstance(scheduler, str) or scheduler not in config.taint_aware_scheduler_set:
        return True
    tolerations = spec.get("tolerations")
    if tolerations is None:
        return False
    if not isinstance(tolerations, list):
        return True
    return any(tolerates(toleration, taint) for toleration in tolerations for taint in taints)
