"""The AdmissionReview envelope: a parsed ``admission.k8s.io/v1`` request in, a typed response out.

Pure: no Flask, no sockets, no clock, no logging. The web layer (``webhook.app``) parses the body, calls
:func:`review`, serialises the result and records metrics and logs from the returned :class:`Outcome`.

The envelope is typed as kopf types it (``kopf/_cogs/structs/reviews.py``, nolar/kopf commit 1c103481):
``TypedDict`` request and response, ``Literal`` operations. A body arrives as untrusted JSON, so :func:`parse`
takes any object and checks the parts the webhook reads; :class:`AdmissionReview` is what a usable one looks like.

The contract followed here (see ``docs/webhook.md``): the response echoes ``apiVersion``/``kind``/``uid``;
``patchType`` appears only together with a patch; a denial carries ``status.code`` 403 (500 for an internal
error) and a message naming the rule, the container and the fix, bounded in length (the first violations,
then a count of the rest); each warning is at most 120 characters and all of them together stay within
``WARNING_BUDGET_CHARS``, ending with a count of what did not fit; ``auditAnnotations`` keys are short, valid
qualified-name parts (the API server prefixes them with the webhook name).
"""

from __future__ import annotations

import base64
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypedDict

import orjson

from gpu_fence.verdicts import ReviewVerdict
from gpu_fence.warning_text import MAX_WARNING_CHARS, split_warning, truncate_warning

from .reasons import BadRequestReason

if TYPE_CHECKING:
    from .config import PolicyConfig

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
#: The API server keeps at most 4096 characters of warnings per request, from every webhook, policy and its own
#: checks together; past that it cuts each warning to 256 characters and then drops the rest without a word
#: (``truncateAtTotalRunes = 4 * 1024`` in k8s.io/apiserver/pkg/endpoints/filters/warning.go; the docs: "If more
#: than 4096 characters of warning messages are added (from all sources), additional warning messages are
#: ignored"). gpu-fence spends at most half of it, leaving room for the others, and says what it left out.
WARNING_BUDGET_CHARS = 2048
#: A denial's message lists violations up to this length and counts the rest: the message becomes the client's
#: error, a controller's FailedCreate event and an audit log entry, all read by people. ``check`` lists all.
MAX_DENY_MESSAGE_CHARS = 2048
#: One violation's clause in a denial (a hostPath or annotation key can be long); the rest of it is cut.
MAX_DENY_CLAUSE_CHARS = 400
#: A warning too long for one line goes on in the next ones, up to this many; a longer one is cut (a hostPath or an
#: annotation key can be long), so that one violation cannot take the whole budget from the others.
MAX_WARNING_LINES = 4
#: The API server accepts annotation values of any length, but audit events are read by people.
MAX_AUDIT_VALUE_CHARS = 1024


# -- the AdmissionReview, as the API server sends it and as the webhook answers -------------------------------------

#: A Kubernetes object as JSON decodes it: plain dicts and lists, API field names.
RawObject = dict[str, Any]
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


# The keys every request and every response has, in a base of their own: ``Required[...]`` would say the same to a
# type checker, but under postponed annotations the class forgets it at run time (``__required_keys__``).
class _RequestKeys(TypedDict):
    uid: str
    kind: GroupVersionKind
    operation: Operation


class AdmissionRequest(_RequestKeys, total=False):
    """``request`` of an ``admission.k8s.io/v1`` AdmissionReview (what the API server may send)."""

    resource: GroupVersionResource
    subResource: str
    requestKind: GroupVersionKind
    requestResource: GroupVersionResource
    requestSubResource: str
    name: str
    namespace: str
    userInfo: UserInfo
    object: RawObject | None
    oldObject: RawObject | None
    dryRun: bool
    options: RawObject | None


class AdmissionReview(TypedDict):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class ResponseStatus(TypedDict):
    """``response.status`` of a denial: the API server shows ``message`` to the client."""

    code: int
    reason: str
    status: Literal["Failure"]
    message: str


class _ResponseKeys(TypedDict):
    uid: str
    allowed: bool


class AdmissionResponse(_ResponseKeys, total=False):
    patchType: Literal["JSONPatch"]  # only with a patch
    patch: str  # base64 of the JSON Patch
    status: ResponseStatus
    warnings: list[str]
    auditAnnotations: dict[str, str]


class AdmissionReviewResponse(TypedDict):
    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    response: AdmissionResponse


# -- what the envelope needs of a policy ------------------------------------------------------------------------------


class PolicyViolation(Protocol):
    """One broken rule, or one piece of advice (``webhook.policy.Violation`` is both)."""

    @property
    def rule(self) -> str: ...

    @property
    def container(self) -> str | None: ...

    @property
    def message(self) -> str: ...  # rule id, what is wrong, the fix, the way out: one line

    @property
    def finding(self) -> str: ...  # the message without the way out

    @property
    def advice(self) -> str: ...  # rule id and what to do, as a warning leads with it

    @property
    def way_out(self) -> str: ...  # the exemption or upstream setting for trusted infrastructure, or ""


class PolicyMutation(Protocol):
    @property
    def patch(self) -> Sequence[Mapping[str, Any]]: ...  # JSON Patch operations

    @property
    def pinned(self) -> Sequence[str]: ...


class PolicyValidation(Protocol):
    @property
    def violations(self) -> Sequence[PolicyViolation]: ...

    @property
    def warnings(self) -> Sequence[PolicyViolation]: ...


class Policy(Protocol):
    """The policy calls the envelope needs (``webhook.policy`` provides them as module functions)."""

    def exemption(self, pod: RawObject, config: PolicyConfig, *, namespace: str) -> str | None: ...

    def mutate(
        self, pod: RawObject, config: PolicyConfig, *, only: Collection[str] | None = None
    ) -> PolicyMutation: ...

    def apply_patch(self, document: RawObject, patch: Collection[Mapping[str, Any]]) -> RawObject: ...

    def validate(
        self,
        pod: RawObject,
        config: PolicyConfig,
        *,
        only: Collection[str] | None = None,
        namespace: str | None = None,
    ) -> PolicyValidation: ...

    def validate_update(
        self, pod: RawObject, old_pod: RawObject | None, config: PolicyConfig, *, namespace: str | None = None
    ) -> PolicyValidation: ...


# -- the envelope --------------------------------------------------------------------------------------------------


class Endpoint(Enum):
    """What a URL path asks of the webhook; the value is the metric label."""

    MUTATE = "mutate"
    VALIDATE = "validate"  # enforce: violations deny
    VALIDATE_WARN = "validate-warn"  # warn: allowed, violations returned as warnings


class BadReview(ValueError):
    """The body is not a usable AdmissionReview; answered with a 4xx, never evaluated.

    ``reason`` is the label of the ``gpu_fence_webhook_bad_requests_total`` metric and the answer's ``error``.
    """

    def __init__(self, reason: BadRequestReason, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Request:
    """The parts of ``request`` the webhook uses, checked once."""

    uid: str
    operation: str  # as sent: an ``Operation``, or anything else, which is allowed unjudged
    kind: str  # "Pod" only when group "" / version "v1"
    sub_resource: str
    namespace: str
    name: str  # for logs only: empty on CREATE with generateName
    dry_run: bool
    obj: RawObject | None
    old_obj: RawObject | None

    @property
    def is_pod(self) -> bool:
        return self.kind == "Pod"


@dataclass(frozen=True)
class Outcome:
    """What one review decided: the response document plus what logs and metrics need."""

    response: AdmissionReviewResponse
    verdict: ReviewVerdict
    rules: tuple[str, ...] = ()
    error: str | None = None
    request: Request | None = field(default=None, compare=False)


def parse(body: object) -> Request:
    """Check the envelope and pull out the request. Raises :class:`BadReview` naming what to fix."""
    if not isinstance(body, dict):
        raise BadReview(BadRequestReason.NOT_AN_OBJECT, "body must be a JSON object (an AdmissionReview)")
    if body.get("kind") != KIND:
        raise BadReview(BadRequestReason.WRONG_KIND, f"kind must be {KIND!r}, got {_short(body.get('kind'))}")
    if body.get("apiVersion") != API_VERSION:
        raise BadReview(
            BadRequestReason.WRONG_API_VERSION,
            f"apiVersion must be {API_VERSION!r} (register the webhook with admissionReviewVersions: [v1]), "
            f"got {_short(body.get('apiVersion'))}",
        )
    request = body.get("request")
    if not isinstance(request, dict):
        raise BadReview(BadRequestReason.MISSING_REQUEST, "request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview(BadRequestReason.MISSING_UID, "request.uid is missing or not a non-empty string")
    operation = request.get("operation")
    if not isinstance(operation, str) or not operation:
        raise BadReview(BadRequestReason.MISSING_OPERATION, "request.operation is missing or not a string")
    kind = request.get("kind")
    is_core_pod = (
        isinstance(kind, dict)
        and kind.get("kind") == "Pod"
        and kind.get("group", "") == ""
        and kind.get("version") == "v1"
    )
    sub_resource = _string_field(request, "subResource")
    namespace = _string_field(request, "namespace")
    obj = request.get("object")
    old_obj = request.get("oldObject")
    if obj is not None and not isinstance(obj, dict):
        raise BadReview(BadRequestReason.MALFORMED_REQUEST, "request.object must be an object or null")
    if old_obj is not None and not isinstance(old_obj, dict):
        raise BadReview(BadRequestReason.MALFORMED_REQUEST, "request.oldObject must be an object or null")
    if is_core_pod and operation in ("CREATE", "UPDATE") and obj is None:
        raise BadReview(BadRequestReason.MALFORMED_REQUEST, f"request.object is required for a Pod {operation}")
    if is_core_pod and obj is not None and not isinstance(obj.get("spec", {}), dict):
        raise BadReview(BadRequestReason.MALFORMED_REQUEST, "request.object.spec must be an object")
    metadata = obj.get("metadata") if obj else None
    metadata = metadata if isinstance(metadata, dict) else {}
    if not namespace:
        # Current API servers default the object's namespace from the URL before admission; older ones sent
        # an empty one. request.namespace is authoritative; the object is a fallback only.
        fallback = metadata.get("namespace")
        namespace = fallback if isinstance(fallback, str) else ""
    name = request.get("name") or metadata.get("name") or ""
    if not name and isinstance(metadata.get("generateName"), str):
        name = metadata["generateName"] + "*"
    return Request(
        uid=uid,
        operation=operation,
        kind="Pod" if is_core_pod else (kind.get("kind", "") if isinstance(kind, dict) else ""),
        sub_resource=sub_resource,
        namespace=namespace,
        name=name if isinstance(name, str) else "",
        dry_run=request.get("dryRun") is True,
        obj=obj,
        old_obj=old_obj,
    )


def _string_field(request: dict[str, Any], key: str) -> str:
    """``request[key]`` where the API sends a string or nothing (then ``""``)."""
    value = request.get(key) or ""
    if not isinstance(value, str):
        raise BadReview(BadRequestReason.MALFORMED_REQUEST, f"request.{key} must be a string")
    return value


def review(body: object, endpoint: Endpoint, config: PolicyConfig, policy: Policy) -> Outcome:
    """Answer one AdmissionReview. Raises :class:`BadReview` for an unusable envelope, nothing else.

    An exception from the policy is caught here: on ``/validate`` it denies (fail closed: validation is the
    control that enforces the final state), on ``/mutate`` and ``/validate/warn`` it allows without a patch
    (mutation is best effort because validation runs after it; warn mode must never block).
    """
    request = parse(body)
    try:
        outcome = _judge(request, endpoint, config, policy)
    except Exception as error:  # the fail-closed/fail-open boundary: every policy bug lands here
        reason = f"{type(error).__name__}: {error}"
        outcome = _internal_error(request, endpoint, reason)
    return Outcome(outcome.response, outcome.verdict, outcome.rules, outcome.error, request)


def new_container_names(request: Request) -> frozenset[str] | None:
    """For ``UPDATE pods/ephemeralcontainers``: the ephemeral containers that this update adds.

    ``None`` means "judge the whole pod" (a CREATE). Ephemeral containers cannot be changed or removed once
    added, so the ones already in ``oldObject`` were judged when they were added.
    """
    if request.operation == "CREATE":
        return None
    old = _ephemeral_names(request.old_obj)
    return frozenset(_ephemeral_names(request.obj) - old)


def _judge(request: Request, endpoint: Endpoint, config: PolicyConfig, policy: Policy) -> Outcome:
    if not request.is_pod or not _is_judged(request):
        return _answer(request, allowed=True, verdict=ReviewVerdict.ALLOWED)
    pod = request.obj
    assert pod is not None  # parse() guarantees an object for Pod CREATE/UPDATE
    reason = policy.exemption(pod, config, namespace=request.namespace)
    if reason:
        return _answer(request, allowed=True, verdict=ReviewVerdict.EXEMPT, audit={"exempt": reason})
    namespace = request.namespace
    if request.operation == "UPDATE" and request.sub_resource == "":
        if endpoint is Endpoint.MUTATE:  # containers are immutable: nothing to pin
            return _answer(request, allowed=True, verdict=ReviewVerdict.ALLOWED)
        return _validated(request, endpoint, policy.validate_update(pod, request.old_obj, config, namespace=namespace))
    only = new_container_names(request)
    if only is not None and not only:
        return _answer(request, allowed=True, verdict=ReviewVerdict.ALLOWED)  # no new ephemeral container
    if endpoint is Endpoint.MUTATE:
        mutation = policy.mutate(pod, config, only=only)
        if not mutation.patch:
            return _answer(request, allowed=True, verdict=ReviewVerdict.ALLOWED)
        return _answer(
            request,
            allowed=True,
            verdict=ReviewVerdict.PATCHED,
            patch=list(mutation.patch),
            audit={"pinned": ",".join(mutation.pinned)},
        )
    if endpoint is Endpoint.VALIDATE_WARN:
        # No mutating webhook runs in a warn namespace: judge the pod as it would leave it (as ``check`` does), so
        # that what enforcing would pin is said once instead of as an unpinned-container per container.
        mutation = policy.mutate(pod, config, only=only)
        pinned = policy.apply_patch(pod, mutation.patch) if mutation.patch else pod
        validation = policy.validate(pinned, config, only=only, namespace=namespace)
        return _validated(request, endpoint, validation, would_pin=tuple(mutation.pinned))
    return _validated(request, endpoint, policy.validate(pod, config, only=only, namespace=namespace))


def _validated(
    request: Request, endpoint: Endpoint, validation: PolicyValidation, *, would_pin: tuple[str, ...] = ()
) -> Outcome:
    advice = [split_warning(warning.message, max_lines=MAX_WARNING_LINES) for warning in validation.warnings]
    if would_pin:
        advice.insert(0, split_warning(_would_pin(would_pin), max_lines=MAX_WARNING_LINES))
    violations = tuple(validation.violations)
    if not violations:
        return _answer(request, allowed=True, verdict=ReviewVerdict.ALLOWED, warnings=budget_warnings((), advice))
    rules = tuple(dict.fromkeys(violation.rule for violation in violations))
    audit = {"rules": ",".join(rules)}
    ways = list(dict.fromkeys(str(violation.way_out) for violation in violations if violation.way_out))
    if endpoint is Endpoint.VALIDATE_WARN:
        groups = [
            split_warning(describe(violation, violation.advice), max_lines=MAX_WARNING_LINES)
            for violation in violations
        ]
        ways_out = [split_warning(f"gpu-fence: way out: {way}", max_lines=MAX_WARNING_LINES) for way in ways]
        return _answer(
            request,
            allowed=True,
            verdict=ReviewVerdict.WARNED,
            rules=rules,
            warnings=budget_warnings(groups, [*ways_out, *advice]),
            audit=audit,
        )
    lines = [describe(violation, violation.finding) for violation in violations]
    return _answer(
        request,
        allowed=False,
        verdict=ReviewVerdict.DENIED,
        rules=rules,
        warnings=budget_warnings((), advice),
        audit=audit,
        status={
            "code": 403,
            "reason": "Forbidden",
            "status": "Failure",
            "message": deny_message(lines, [violation.rule for violation in violations], ways),
        },
    )


def _would_pin(names: Sequence[str]) -> str:
    count = f"{len(names)} container" + ("" if len(names) == 1 else "s")
    return f"gpu-fence: enforce mode would pin {count} to NVIDIA_VISIBLE_DEVICES=void: {', '.join(names)}"


def budget_warnings(
    violation_groups: Sequence[Sequence[str]], advice: Sequence[Sequence[str]], budget: int = WARNING_BUDGET_CHARS
) -> list[str]:
    """The warnings to return: each violation's lines, then the advice's, in order, within ``budget``.

    Each group is one violation's (or one piece of advice's) lines, each at most ``MAX_WARNING_CHARS`` long
    (``split_warning``); a group is kept whole or not at all. When they do not all fit, the first groups that do
    are kept and a last warning counts the rest, so that a pod with many violations is told it has more, instead of
    the API server dropping the tail silently. The rule ids of all violations stay in the ``rules`` audit
    annotation.
    """
    groups = [[truncate_warning(line) for line in group] for group in [*violation_groups, *advice]]
    if sum(len(line) for group in groups for line in group) <= budget:
        return [line for group in groups for line in group]
    room = budget - MAX_WARNING_CHARS  # the summary is one warning, at most MAX_WARNING_CHARS long
    kept: list[list[str]] = []
    used = 0
    for group in groups:
        size = sum(map(len, group))
        if used + size > room:
            break
        kept.append(group)
        used += size
    more_violations = max(0, len(violation_groups) - len(kept))
    more_advice = len(groups) - len(kept) - more_violations
    counts = [_count(more_violations, "violation"), _count(more_advice, "warning")]
    summary = (
        f"gpu-fence: … and {', '.join(c for c in counts if c)} (see the audit annotation or gpu-fence-webhook check)"
    )
    return [*(line for group in kept for line in group), truncate_warning(summary)]


def deny_message(
    lines: Sequence[str], rules: Sequence[str], ways: Sequence[str] = (), limit: int = MAX_DENY_MESSAGE_CHARS
) -> str:
    """``gpu-fence: N violation(s): <first clauses>; and M more (<their rule ids>). Way out: <ways>``, at most
    ``limit`` long.

    The first violation is always listed (cut to ``MAX_DENY_CLAUSE_CHARS`` if need be); later ones while they
    fit with room left for the closing count and the ways out. ``rules[i]`` is the rule id of ``lines[i]``. Each
    way out (the exemption or upstream setting for trusted infrastructure) is said once, however many violations
    share it, and together they take at most ``MAX_DENY_CLAUSE_CHARS``.
    """
    tail = truncate_warning(". Way out: " + " | ".join(ways), MAX_DENY_CLAUSE_CHARS) if ways else ""
    limit -= len(tail)
    head = f"gpu-fence: {len(lines)} violation(s): "
    # room for "; and N more violation(s) (" + every rule id, which is what the tail can grow to
    reserve = len("; and  more violation(s) ()") + len(str(len(lines))) + len(", ".join(dict.fromkeys(rules)))
    clauses: list[str] = []
    used = len(head)
    for index, line in enumerate(lines):
        clause = truncate_warning(line, MAX_DENY_CLAUSE_CHARS)
        last = index == len(lines) - 1
        needed = (2 if clauses else 0) + len(clause) + (0 if last else reserve)
        if clauses and used + needed > limit:
            break
        clauses.append(clause)
        used += (2 if len(clauses) > 1 else 0) + len(clause)
    message = head + "; ".join(clauses)
    rest = len(lines) - len(clauses)
    if rest:
        message += f"; and {rest} more violation(s) ({', '.join(dict.fromkeys(rules[len(clauses) :]))})"
    return message[:limit] + tail


def _count(number: int, noun: str) -> str:
    if number <= 0:
        return ""
    return f"{number} more {noun}" + ("" if number == 1 else "s")


def describe(violation: PolicyViolation, text: str) -> str:
    """One line per violation, led by the rule id so that people and log searches find it.

    ``text`` is one of the violation's own lines (its finding for a denial, its advice for a warning), which already
    name the rule, the container and the fix; a line that does not is completed here rather than trusted.
    """
    message = str(text)
    if message.startswith(f"{violation.rule}:"):
        return message
    container = str(violation.container or "")
    if container and container not in message:
        return f"{violation.rule}: container {container!r}: {message}"
    return f"{violation.rule}: {message}"


def _is_judged(request: Request) -> bool:
    if request.operation == "CREATE":
        return request.sub_resource == ""
    # UPDATE of the pod itself can add annotations; of pods/ephemeralcontainers, containers
    return request.operation == "UPDATE" and request.sub_resource in ("", "ephemeralcontainers")


def _ephemeral_names(pod: RawObject | None) -> set[str]:
    spec = pod.get("spec") if isinstance(pod, dict) else None
    containers = spec.get("ephemeralContainers") if isinstance(spec, dict) else None
    if not isinstance(containers, list):
        return set()
    return {c["name"] for c in containers if isinstance(c, dict) and isinstance(c.get("name"), str)}


def _internal_error(request: Request, endpoint: Endpoint, reason: str) -> Outcome:
    reason = reason[:500]
    audit = {"error": reason}
    if endpoint is Endpoint.VALIDATE:
        message = (
            f"gpu-fence: internal error while checking the pod, denied (fail closed): {reason}. "
            "Retry; if it persists, report it to the cluster administrators."
        )
        status: ResponseStatus = {"code": 500, "reason": "InternalError", "status": "Failure", "message": message}
        return _answer(request, allowed=False, verdict=ReviewVerdict.ERROR, audit=audit, status=status, error=reason)
    warnings = [truncate_warning(f"gpu-fence: internal error, pod not checked: {reason}")]
    return _answer(request, allowed=True, verdict=ReviewVerdict.ERROR, audit=audit, warnings=warnings, error=reason)


def _answer(
    request: Request,
    *,
    allowed: bool,
    verdict: ReviewVerdict,
    rules: tuple[str, ...] = (),
    patch: list[Mapping[str, Any]] | None = None,
    warnings: list[str] | None = None,
    audit: Mapping[str, str] | None = None,
    status: ResponseStatus | None = None,
    error: str | None = None,
) -> Outcome:
    response: AdmissionResponse = {"uid": request.uid, "allowed": allowed}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode("ascii")
    if status is not None:
        response["status"] = status
    if warnings:
        response["warnings"] = warnings
    if audit:
        response["auditAnnotations"] = {key: value[:MAX_AUDIT_VALUE_CHARS] for key, value in audit.items()}
    document: AdmissionReviewResponse = {"apiVersion": API_VERSION, "kind": KIND, "response": response}
    return Outcome(document, verdict, rules, error, request)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
