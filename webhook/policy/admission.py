"""The policy's entry points, as admission calls them: :func:`mutate` (the pin), :func:`validate` (every rule on
the pod as it will run), :func:`validate_update` (a plain pod UPDATE), :func:`exemption`, and :func:`evaluate`, which
chains them as the offline check does.

They never raise on malformed input and never modify it: what cannot be read is treated conservatively and a
decision is always returned.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from gpu_fence import kai

from ..config import PolicyConfig
from ..scope import reaches_gpu_nodes
from ..ways_out import way_out
from .advice import advice
from .patch import apply_patch, pin
from .pod import EMPTY, AnnotationChange, KaiChange, Passes, PodView, mapping, read_pod, spec_containers
from .registry import Reach
from .rules import RULES
from .rules.allocation import kai_annotation_update
from .rules.device_annotations import cdi_annotation, runtime_annotation
from .values import NO_MUTATION, NO_VIOLATIONS, Decision, Mutation, Validation, Violation

#: The annotation the kubelet puts on the mirror of a static pod (see :func:`exemption`).
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"

#: What ``validate`` runs: every rule but those only a plain pod UPDATE can break, in the table's order.
_ON_CREATE = tuple(rule.check for rule in RULES if not rule.update_only)
#: The rules that guard the node: ``gpu_node_taints`` scopes them, and their violations name a way out.
_GUARD_NODE = frozenset(rule.id for rule in RULES if rule.reach is Reach.NODE)


def mutate(pod: Any, config: PolicyConfig, *, only: Collection[str] | None = None) -> Mutation:
    """Pin ``NVIDIA_VISIBLE_DEVICES=void`` (and each configured alias) on every container that requests no
    device-plugin GPU and has no such entry; nothing else.

    ``void`` is explicit because an unset variable means ``all`` on legacy CUDA images. An existing entry is
    never touched (validation judges it) and never duplicated, so mutating the mutated pod yields no patch.
    KAI's fraction container gets the ``NVIDIA_VISIBLE_DEVICES`` pin too: KAI's webhook drops any entry of that
    name and appends its reference (``AddEnvVarToContainer``), and where it does not run, nothing else would
    fill the variable. ``only`` restricts the pin to these ephemeral containers (``pods/ephemeralcontainers``
    UPDATE).
    """
    operations, pinned = pin(read_pod(pod, config, only).containers)
    if not operations:
        return NO_MUTATION
    return Mutation(patch=tuple(operations), pinned=tuple(pinned))


def validate(
    pod: Any, config: PolicyConfig, *, only: Collection[str] | None = None, namespace: str | None = None
) -> Validation:
    """Judge the pod as it will run (after all mutation): every rule of ``RULES`` but ``UPDATE_RULES``, plus warnings.

    With ``only`` (a ``pods/ephemeralcontainers`` UPDATE) just those ephemeral containers are judged, with the
    hostPath volumes they mount; pod-level annotations and runtime class were judged when the pod was created.
    With ``gpu_node_taints`` configured, a pod that cannot land on a GPU node (``webhook.scope``) gets the
    violations of the rules that guard the node as warnings. ``namespace`` (the request's; else the pod's own) is
    named in the ways out of the violations.
    """
    view = read_pod(pod, config, only)
    violations: list[Violation] = []
    for check in _ON_CREATE:  # a plain loop: one call per rule per review, nearly all of them answering []
        found = check(view)
        if found:
            violations += found
    warnings = advice(view)
    if not violations and not warnings:
        return NO_VIOLATIONS
    if violations and config.gpu_node_taints and not reaches_gpu_nodes(view.spec, config):
        guarded = [v for v in violations if v.rule in _GUARD_NODE]
        violations = [v for v in violations if v.rule not in _GUARD_NODE]
        warnings = [*(_out_of_scope(v) for v in guarded), *warnings]
    if violations:
        violations = _with_ways_out(view, violations, namespace)
    return Validation(violations=tuple(violations), warnings=tuple(warnings))


def _out_of_scope(violation: Violation) -> Violation:
    """A node rule's violation on a pod that cannot land on a GPU node, as the warning that says why it passes."""
    return Violation(
        violation.rule,
        violation.container,
        f"{violation.what} (allowed: the pod tolerates none of gpu_node_taints, so it runs on no GPU node)",
    )


def _with_ways_out(view: PodView, violations: list[Violation], namespace: str | None) -> list[Violation]:
    """Each violation with its way out for trusted infrastructure (``webhook.ways_out``), where it has one. Only on
    the path of a pod that breaks a rule: the bodies are looked up here, not kept for every pod."""
    if namespace is None:
        namespace = view.metadata.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        namespace = "<namespace>"
    bodies = {container.name: container.body for container in view.containers}
    every = [*spec_containers(view.spec), *(container.body for container in view.containers)]
    answered: list[Violation] = []
    for violation in violations:
        if violation.way_out:
            answered.append(violation)
            continue
        body = bodies.get(violation.container) if violation.container is not None else None
        found = way_out(
            guards_node=violation.rule in _GUARD_NODE,
            container=body,
            spec=view.spec,
            containers=every,
            namespace=namespace,
        )
        if found is None:
            answered.append(violation)
        elif found.replaces_fix:
            answered.append(replace(violation, fix="", way_out=found.text))
        else:
            answered.append(replace(violation, way_out=found.text))
    return answered


def _annotations(pod: Any) -> Mapping[str, Any]:
    return mapping(mapping(pod.get("metadata")).get("annotations")) if isinstance(pod, dict) else EMPTY


def validate_update(pod: Any, old_pod: Any, config: PolicyConfig, *, namespace: str | None = None) -> Validation:
    """Judge a plain pod UPDATE: the CDI and runtime annotations it adds or changes, on a pod KAI schedules the
    annotations KAI's binder reads that it adds, removes or changes, and, where ``gpu_node_taints`` scopes the node
    rules, tolerations that bring the pod into scope; nothing else.

    Containers, volumes and runtime class are immutable once a pod exists, but annotations are not: one added
    while the pod waits for its sandbox (a scheduling gate, a pending pod) reaches the runtime like one set at
    CREATE, and KAI's binder picks the ConfigMap it fills from the annotations as they are when it binds.
    Annotations that were already there were judged at CREATE (or let through in warn mode); judging them again
    would deny every later update of the pod, finalizer removal included. Tolerations can be added too, and a
    pending pod that now tolerates a GPU taint can be scheduled onto a GPU node: the node rules it was spared at
    CREATE judge it now. The GPU rules (``cdi-annotation``, ``kai-annotation-update``) are never out of scope.
    """
    old = _annotations(old_pod)
    new = _annotations(pod)
    added = {key: value for key, value in new.items() if key not in old or old[key] != value}
    changes = _kai_changes(pod, old, new, config)
    violations: list[Violation] = []
    if added or changes:
        view = PodView({"annotations": added}, EMPTY, (), (), config, True, Passes(), tuple(changes))
        violations += [*cdi_annotation(view), *runtime_annotation(view), *kai_annotation_update(view)]
    warnings: list[Violation] = []
    if config.gpu_node_taints and isinstance(pod, dict):
        if _enters_scope(pod, old_pod, config):
            # The whole pod's node rules, runtime-annotation among them (over every annotation, not only the added).
            whole = validate(pod, config, namespace=namespace)
            violations = [v for v in violations if v.rule not in _GUARD_NODE]
            violations += [v for v in whole.violations if v.rule in _GUARD_NODE]
        elif not reaches_gpu_nodes(mapping(pod.get("spec")), config):
            warnings = [_out_of_scope(v) for v in violations if v.rule in _GUARD_NODE]
            violations = [v for v in violations if v.rule not in _GUARD_NODE]
    if not violations and not warnings:
        return NO_VIOLATIONS
    if violations:
        violations = _with_ways_out(read_pod(pod, config, None), violations, namespace)
    return Validation(violations=tuple(violations), warnings=tuple(warnings))


def _enters_scope(pod: dict[str, Any], old_pod: Any, config: PolicyConfig) -> bool:
    """Whether the update brings a pod that could land on no GPU node into the node rules' scope (an old pod that
    cannot be read counts as out of scope, so the new one is judged)."""
    old_spec = mapping(old_pod.get("spec")) if isinstance(old_pod, dict) else EMPTY
    return reaches_gpu_nodes(mapping(pod.get("spec")), config) and not reaches_gpu_nodes(old_spec, config)


def _kai_changes(pod: Any, old: Mapping[str, Any], new: Mapping[str, Any], config: PolicyConfig) -> list[KaiChange]:
    """What the update does (adds, removes, changes) to each annotation KAI's binder reads at bind time, on a pod
    under a configured KAI scheduler (``schedulerName`` is immutable; on any other pod the annotations mean nothing
    to KAI)."""
    scheduler = mapping(pod.get("spec")).get("schedulerName") if isinstance(pod, dict) else None
    if not isinstance(scheduler, str) or scheduler not in config.kai_scheduler_set:
        return []
    changes: list[KaiChange] = []
    for key in kai.BIND_TIME_ANNOTATIONS:
        if key in new and key not in old:
            changes.append(KaiChange(key, AnnotationChange.ADDS))
        elif key in old and key not in new:
            changes.append(KaiChange(key, AnnotationChange.REMOVES))
        elif key in new and new[key] != old[key]:
            changes.append(KaiChange(key, AnnotationChange.CHANGES))
    return changes


def exemption(pod: Any, config: PolicyConfig, *, namespace: str) -> str | None:
    """Why the pod is admitted untouched, or None. Only cluster-controlled facts count: no label or annotation
    a pod author sets can exempt a pod.

    Mirror pods are the exception that proves the rule: the kubelet never runs a pod from the API server that
    carries the mirror annotation (it only mirrors a static pod it runs from its own manifest), so faking the
    annotation gains nothing, while mutating a real mirror pod would fight the kubelet.
    """
    if isinstance(namespace, str) and namespace in config.exempt_namespace_set:
        return f"namespace {namespace} is exempt"
    if not isinstance(pod, dict):
        return None
    if MIRROR_POD_ANNOTATION in mapping(mapping(pod.get("metadata")).get("annotations")):
        return "mirror pod of a static pod (the kubelet runs it from its own manifest)"
    spec = mapping(pod.get("spec"))
    # The ServiceAccount admission plugin defaults an empty name to "default" before webhooks run.
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    if isinstance(account, str) and isinstance(namespace, str):
        pair = f"{namespace}/{account}"
        if pair in config.exempt_service_account_set:
            return f"service account {pair} is exempt"
    return None


def evaluate(pod: Any, config: PolicyConfig, *, namespace: str) -> Decision:
    """What admission does end to end (and what the offline check reports): exemption, then mutation, then
    validation of the pod as mutated."""
    reason = exemption(pod, config, namespace=namespace)
    if reason is not None:
        return Decision(exempt=reason, mutation=NO_MUTATION, validation=NO_VIOLATIONS)
    mutation = mutate(pod, config)
    patched = apply_patch(pod, mutation.patch) if mutation.patch else pod
    return Decision(exempt=None, mutation=mutation, validation=validate(patched, config, namespace=namespace))
