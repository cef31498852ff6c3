"""The admission policy: pin ``NVIDIA_VISIBLE_DEVICES=void`` on containers with no GPU, reject other GPU paths.

Pure functions over the Pod as a plain dict (as JSON-decoded from the AdmissionReview or read from YAML). They
never raise on malformed input and never modify it: what cannot be read is treated conservatively (a container
whose ``env`` is not a list cannot be pinned, so it is a violation) and a decision is always returned.

Reading order: ``values`` (the rule ids, and what the policy returns), ``pod`` (how a pod is read, and the passes
over it that rules share), ``registry`` (the rule table), the rules in ``rules/`` (one function per rule, named after
its rule id, grouped by what they judge; KAI's reference in ``kai_reference``), ``advice`` (the warnings), ``patch``
(the JSON Patch of the pin) and ``admission`` (``mutate``, ``validate``, ``validate_update``, ``exemption`` and
``evaluate``, which chains them as the offline check does). The GPU vocabulary (what is a GPU request, what a
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
from .admission import MIRROR_POD_ANNOTATION, evaluate, exemption, mutate, validate, validate_update
from .patch import PIN_VALUE, apply_patch
from .registry import Reach, Rule
from .rules import RULES, UPDATE_RULES
from .values import (
    NO_MUTATION,
    NO_VIOLATIONS,
    NVIDIA_RUNTIME_CLASS,
    Decision,
    Mutation,
    RuleId,
    Validation,
    Violation,
)

__all__ = [
    "CDI_ANNOTATION_PREFIXES",
    "MIRROR_POD_ANNOTATION",
    "NO_MUTATION",
    "NO_VIOLATIONS",
    "NVIDIA_RUNTIME_CLASS",
    "PIN_VALUE",
    "RULES",
    "UPDATE_RULES",
    "Decision",
    "Mutation",
    "Reach",
    "Rule",
    "RuleId",
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
