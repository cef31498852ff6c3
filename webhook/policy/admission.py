"""The policy's entry points: ``mutate``, ``validate``, ``validate_update``, ``exemption``, ``evaluate``."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from gpu_fence import kai

from ..config import PolicyConfig
from ..scope import reaches_gpu_nodes
from ..ways_out import way_out
from .advice import _warnings
from .patch import _FIELD_POINTERS, apply_patch
from .pod import _EMPTY, _mapping, _missing_pins, _Pod, _read_pod
from .rules import _CHECKS
from .rules.allocation import _NO_CHANGES, kai_annotation_update
from .rules.annotations import cdi_annotation, runtime_annotation
from .rules.privileges import _spec_containers
from .values import (
    MIRROR_POD_ANNOTATION,
    NO_MUTATION,
    NO_VIOLATIONS,
    PIN_VALUE,
    RULES,
    Decision,
    Mutation,
    Reach,
    Validation,
    Violation,
)


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
    view = _read_pod(pod, config, only)
    operations: list[dict[str, Any]] = []
    pinned: list[str] = []
    for container in view.containers:
        pins = container.pins
        if not pins or not container.env_readable:
            continue  # a GPU container; or nothing can be appended, which unpinned-container reports
        path = f"{_FIELD_POINTERS[container.field]}/{container.index}/env"
        if container.body.get("env") is None:  # absent or null: add the whole array ("/env/-" needs one)
            operations.append({"op": "add", "path": path, "value": [{"name": n, "value": PIN_VALUE} for n in pins]})
        elif len(pins) == 1:  # _missing_pins inline for the usual single pin: this runs for every container
            pin = pins[0]
            for name, _ in container.env:
                if name == pin:
                    break
            else:
                operations.append({"op": "add", "path": path + "/-", "value": {"name": pin, "value": PIN_VALUE}})
                pinned.append(container.name)
            continue
        else:
            missing = _missing_pins(container)
            if not missing:
                continue
            for name in missing:
                operations.append({"op": "add", "path": path + "/-", "value": {"name": name, "value": PIN_VALUE}})
        pinned.append(container.name)
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
    view = _read_pod(pod, config, only)
    violations: list[Violation] = []
    for check in _CHECKS:  # a plain loop: one call per rule per review, nearly all of them answering []
        found = check(view)
        if found:
            violations += found
    warnings = _warnings(view)
    if not violations and not warnings:
        return NO_VIOLATIONS
    if violations and config.gpu_node_taints and not reaches_gpu_nodes(view.spec, config):
        guarded = [v for v in violations if _REACH.get(v.rule) is Reach.NODE]
        violations = [v for v in violations if _REACH.get(v.rule) is not Reach.NODE]
        warnings = [*(_out_of_scope(v) for v in guarded), *warnings]
    if violations:
        violations = _with_ways_out(view, violations, namespace)
    return Validation(violations=tuple(violations), warnings=tuple(warnings))


_REACH = {rule.id: rule.reach for rule in RULES}


def _out_of_scope(violation: Violation) -> Violation:
    """A node rule's violation on a pod that cannot land on a GPU node, as the warning that says why it passes."""
    return Violation(
        violation.rule,
        violation.container,
        f"{violation.what} (allowed: the pod tolerates none of gpu_node_taints, so it runs on no GPU node)",
    )


def _with_ways_out(view: _Pod, violations: list[Violation], namespace: str | None) -> list[Violation]:
    """Each violation with its way out for trusted infrastructure (``webhook.ways_out``), where it has one. Only on
    the path of a pod that breaks a rule: the bodies are looked up here, not kept for every pod."""
    if namespace is None:
        namespace = view.metadata.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        namespace = "<namespace>"
    bodies = {container.name: container.body for container in view.containers}
    every = [*_spec_containers(view.spec), *(container.body for container in view.containers)]
    answered: list[Violation] = []
    for violation in violations:
        if violation.way_out:
            answered.append(violation)
            continue
        body = bodies.get(violation.container) if violation.container is not None else None
        found = way_out(
            guards_node=_REACH.get(violation.rule) is Reach.NODE,
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
    return _mapping(_mapping(pod.get("metadata")).get("annotations")) if isinstance(pod, dict) else _EMPTY


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
        view = _Pod({"annotations": added}, _EMPTY, (), (), config, True, {"kai changes": changes})
        violations += [*cdi_annotation(view), *runtime_annotation(view), *kai_annotation_update(view)]
    warnings: list[Violation] = []
    if config.gpu_node_taints and isinstance(pod, dict):
        if _enters_scope(pod, old_pod, config):
            # The whole pod's node rules, runtime-annotation among them (over every annotation, not only the added).
            whole = validate(pod, config, namespace=namespace)
            violations = [v for v in violations if _REACH.get(v.rule) is not Reach.NODE]
            violations += [v for v in whole.violations if _REACH.get(v.rule) is Reach.NODE]
        elif not reaches_gpu_nodes(_mapping(pod.get("spec")), config):
            warnings = [_out_of_scope(v) for v in violations if _REACH.get(v.rule) is Reach.NODE]
            violations = [v for v in violations if _REACH.get(v.rule) is not Reach.NODE]
    if not violations and not warnings:
        return NO_VIOLATIONS
    if violations:
        violations = _with_ways_out(_read_pod(pod, config, None), violations, namespace)
    return Validation(violations=tuple(violations), warnings=tuple(warnings))


def _enters_scope(pod: dict[str, Any], old_pod: Any, config: PolicyConfig) -> bool:
    """Whether the update brings a pod that could land on no GPU node into the node rules' scope (an old pod that
    cannot be read counts as out of scope, so the new one is judged)."""
    old_spec = _mapping(old_pod.get("spec")) if isinstance(old_pod, dict) else _EMPTY
    return reaches_gpu_nodes(_mapping(pod.get("spec")), config) and not reaches_gpu_nodes(old_spec, config)


def _kai_changes(
    pod: Any, old: Mapping[str, Any], new: Mapping[str, Any], config: PolicyConfig
) -> list[tuple[str, str]]:
    """``(key, "adds" | "removes" | "changes")`` for each annotation KAI's binder reads at bind time that the update
    touches, on a pod under a configured KAI scheduler (``schedulerName`` is immutable; on any other pod the
    annotations mean nothing to KAI)."""
    scheduler = _mapping(pod.get("spec")).get("schedulerName") if isinstance(pod, dict) else None
    if not isinstance(scheduler, str) or scheduler not in config.kai_scheduler_set:
        return _NO_CHANGES
    changes: list[tuple[str, str]] = []
    for key in kai.BIND_TIME_ANNOTATIONS:
        if key in new and key not in old:
            changes.append((key, "adds"))
        elif key in old and key not in new:
            changes.append((key, "removes"))
        elif key in new and new[key] != old[key]:
            changes.append((key, "changes"))
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
    if MIRROR_POD_ANNOTATION in _mapping(_mapping(pod.get("metadata")).get("annotations")):
        return "mirror pod of a static pod (the kubelet runs it from its own manifest)"
    spec = _mapping(pod.get("spec"))
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
