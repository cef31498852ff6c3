"""The rule table: each rule's function registered with :func:`rule`, beside its code, with its id, the line the
table and the check's reports give it, the bypass vectors it closes and what it guards.

A rule is one function from the pod as read (:class:`~webhook.policy.pod.PodView`) to its violations, named after
its rule id. :func:`table` gives the registered rules in :class:`~webhook.policy.values.RuleId`'s order, and fails
if an id has no function: a new rule is a member of ``RuleId`` where it belongs in the table, a decorated function
in the module of what it judges (``webhook.policy.rules``), and a section of docs/policy.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from .pod import PodView
from .values import RuleId, Violation

#: A rule's function: the pod as read in, its violations out (``[]`` for nearly every pod).
Check = Callable[[PodView], list[Violation]]


class Reach(Enum):
    """What a rule guards, which decides where it applies when ``gpu_node_taints`` scopes the policy."""

    #: A GPU path (the toolkit's variables, mounts and annotations, the allocation itself): judged on every pod. A
    #: rule about the allocation (``bound-gpu-pod``, ``kai-annotation-update``) is one even where the pod could land
    #: on no GPU node: what it guards is that the GPU a container uses is one the scheduler allocated.
    GPU = "gpu"
    #: The node that holds the GPUs: judged only on pods that can land on a GPU node (``webhook.scope``).
    NODE = "node"


@dataclass(frozen=True)
class Rule:
    """One row of the rule table. A rule that guards the node declares ``Reach.NODE``: ``gpu_node_taints`` then
    scopes it, and its violations name the exemption for trusted node agents (``webhook.ways_out``) without code of
    its own; a violation whose ``fix`` is empty is told its way out all the same."""

    id: RuleId
    summary: str
    vectors: tuple[str, ...]
    reach: Reach
    check: Check
    #: Only a plain pod UPDATE can break it (``validate_update``): ``validate`` has no old object to compare with.
    update_only: bool = False


_REGISTERED: dict[RuleId, Rule] = {}


def rule(
    rule_id: RuleId, summary: str, *, vectors: tuple[str, ...], reach: Reach = Reach.GPU, update_only: bool = False
) -> Callable[[Check], Check]:
    """Register the decorated function as the rule ``rule_id``; the function is returned unchanged."""

    def register(check: Check) -> Check:
        if rule_id in _REGISTERED:
            raise ValueError(
                f"rule {rule_id} is registered twice: {_REGISTERED[rule_id].check.__name__} and {check.__name__}"
            )
        _REGISTERED[rule_id] = Rule(rule_id, summary, vectors, reach, check, update_only)
        return check

    return register


def table() -> tuple[Rule, ...]:
    """Every rule, in the table's order; a ``RuleId`` without a registered function is a ``LookupError``."""
    missing = [rule_id.value for rule_id in RuleId if rule_id not in _REGISTERED]
    if missing:
        raise LookupError(f"rules without a registered function: {', '.join(missing)}")
    return tuple(_REGISTERED[rule_id] for rule_id in RuleId)
