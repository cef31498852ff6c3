"""``gpu-fence-webhook check``: the admission policy, offline, over manifests or over live pods.

It answers "what would the webhook do to these pods?" before the webhook is enforcing: in CI over rendered
manifests (``helm template ... | gpu-fence-webhook check -``) and once over a running cluster (``--cluster``)
to see what enforcement would break. Every pod spec found (see ``webhook.discovery``) is evaluated
mutate-then-validate by the same ``webhook.policy.evaluate`` that serves admission.

Namespaces: an object's own ``metadata.namespace``, else ``--namespace``, else ``default`` (the same place
``kubectl apply -n`` would put it). Exemptions by namespace therefore apply as they would at admission.

Exit codes: 0 nothing rejected, 1 something rejected, 2 could not run (usage, unreadable input, no pod spec found,
bad configuration, unreachable API), with one line per problem on stderr: a gate that read nothing never passes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import IO, Any

from gpu_fence.exit_status import ExitStatus
from gpu_fence.kubeconfig import ORDER as KUBECONFIG_ORDER
from gpu_fence.kubeconfig import KubeConfigError, load_configuration
from gpu_fence.version import package_version

from . import policy
from .config import ConfigError, PolicyConfig, load_config
from .discovery import (
    DiscoveryError,
    EmbeddedManifest,
    PodSpecSite,
    find_embedded_manifests,
    find_pod_specs,
    format_path,
    iter_objects,
    object_name,
    object_namespace,
    pod_for_site,
)
from .openreports import render_openreports
from .policy import Decision, RuleId
from .reports import (
    FORMATS,
    Finding,
    PodSpecResult,
    Report,
    render_json,
    render_junit,
    render_sarif,
    render_text,
)
from .sources import (
    MAX_DOCUMENT_BYTES,
    Document,
    Source,
    SourceError,
    SourceKind,
    find_sources,
    parse_documents,
    read_source,
)

DEFAULT_NAMESPACE = "default"
#: ``manifests/base/policy.yaml``, installed with the package under this name (a link in the source tree): one file
#: for what the manifests mount into the webhook and what check judges with by default.
SHIPPED_POLICY = "shipped-policy.yaml"
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
CLUSTER_SOURCE = "cluster"
#: Pods per list call in ``--cluster`` mode: large clusters are read in pages, never in one response.
CLUSTER_PAGE_SIZE = 500
#: Where pod-level violations point, so that a report lands on the annotation, the volume list or the field rather
#: than on the start of the object: relative to the pod template (annotations) or to the pod spec.
_TEMPLATE_FIELDS: dict[str, tuple[str, ...]] = {
    RuleId.CDI_ANNOTATION: ("metadata", "annotations"),
    RuleId.RUNTIME_ANNOTATION: ("metadata", "annotations"),
}
_SPEC_FIELDS: dict[str, tuple[str, ...]] = {
    RuleId.HOST_DEVICE_PATH: ("volumes",),
    RuleId.HOST_PATH: ("volumes",),
    RuleId.HOST_PID: ("hostPID",),
    RuleId.HOST_IPC: ("hostIPC",),
    RuleId.VOLUME_TYPE: ("volumes",),
    RuleId.BOUND_GPU_POD: ("nodeName",),
    RuleId.HOST_PROCESS: ("securityContext",),
}

EPILOG = """\
examples:
  gpu-fence-webhook check manifests/examples/
  helm template my-chart | gpu-fence-webhook check - --format sarif --output gpu-fence.sarif
  gpu-fence-webhook check overlays/prod            # a kustomization: rendered with kubectl kustomize
  gpu-fence-webhook check . --exclude charts --exclude 'deploy/legacy/*'
  gpu-fence-webhook check --cluster --namespace ml-team --format json
  gpu-fence-webhook check --cluster --format openreports | kubectl apply -f -

exit codes: 0 nothing rejected, 1 some pod spec rejected, 2 could not run (the reason is on stderr), which
includes finding no pod spec at all (pass --allow-empty if that is expected)
"""


class CheckError(Exception):
    """The check could not run; the message is one line saying what to fix."""


class ClusterError(CheckError):
    """Live pods could not be listed (no configuration, API unreachable, access denied)."""


class SourceErrors(Exception):
    """Every source that could not be read, so that one run reports them all."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages


def add_arguments(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "check",
        help="run the policy offline over manifests (files, directories, stdin) or live pods",
        description=(
            "Evaluate every pod spec in Kubernetes manifests, or in the live cluster, with the admission policy "
            "(mutate, then validate) and report allowed / mutated / rejected / exempt for each."
        ),
        epilog=EPILOG,
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="YAML or JSON file, directory (read recursively for *.yaml, *.yml, *.json; one that holds a "
        "kustomization is rendered with kubectl kustomize; a Helm chart inside is named on stderr and not read), "
        "or - for stdin; a file reached twice is read once",
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="do not read paths that match GLOB (repeatable): a GLOB without / matches any file or directory name "
        "(--exclude charts, --exclude '*.tmpl.yaml'), one with / the path or a directory above it, whole or from "
        "after any / (--exclude deploy/legacy)",
    )
    parser.add_argument("--format", choices=FORMATS, default="text", help="report format")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="policy configuration file (default: the policy the manifests ship, manifests/base/policy.yaml, "
        "which exempts kube-system and gpu-fence as the installed webhook does)",
    )
    parser.add_argument("--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout")
    parser.add_argument("--cluster", action="store_true", help="check the live pods of the cluster instead of files")
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="exit 0 when no pod spec (or no pod) is found; without it that is an error (exit 2): a CI gate "
        "that reads nothing must not pass",
    )
    parser.add_argument(
        "--namespace",
        "-n",
        metavar="NS",
        help="with --cluster: only this namespace (default: all); with files: the namespace of objects "
        f"that name none (default: {DEFAULT_NAMESPACE})",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help=f"with --cluster: kubeconfig file (default: {KUBECONFIG_ORDER})",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, *, stdin: IO[bytes] | None = None, stdout: IO[str] | None = None) -> ExitStatus:
    """Run the check for parsed arguments; return the exit status (0 clean, 1 rejections, 2 could not run)."""
    out = stdout if stdout is not None else sys.stdout
    try:
        _check_usage(args)
        config = load_policy(args.config)
        if args.cluster:
            report = check_pods(list_cluster_pods(args.namespace, args.kubeconfig), config)
            if not report.results and not args.allow_empty:
                where = f"namespace {args.namespace}" if args.namespace else "any namespace"
                raise CheckError(
                    f"no pods in {where} of the cluster the kubeconfig points at: check --namespace and the "
                    "kubeconfig's context, or pass --allow-empty if none are expected"
                )
        else:
            checked = check_paths(args.paths, config, args.namespace or DEFAULT_NAMESPACE, args.exclude, stdin)
            for note in checked.notes:
                _warn(note)
            if checked.errors:
                raise SourceErrors(checked.errors)
            report = checked.report()
            if not report.results and not args.allow_empty:
                raise CheckError(
                    f"no pod spec found in {checked.describe()}: check the "
                    "paths, render templates first (helm template ... | gpu-fence-webhook check -), or pass "
                    "--allow-empty if no pod spec is expected"
                )
    except (CheckError, ConfigError) as error:
        _error(str(error))
        return ExitStatus.ERROR
    except SourceErrors as errors:
        for message in errors.messages:
            _error(message)
        return ExitStatus.ERROR
    colour = args.output is None and _wants_colour(out)
    text = render(report, args.format, colour=colour)
    if args.output is None:
        out.write(text)
        out.flush()
    else:
        try:
            with open(args.output, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as error:
            _error(f"{args.output}: cannot write the report: {error.strerror or error}")
            return ExitStatus.ERROR
    return ExitStatus.FINDINGS if report.rejected else ExitStatus.SUCCESS


def _check_usage(args: argparse.Namespace) -> None:
    if args.cluster and args.paths:
        raise CheckError("give either PATH arguments or --cluster, not both")
    if not args.cluster and not args.paths:
        raise CheckError("nothing to check: give a file, a directory, - for stdin, or --cluster")
    if args.kubeconfig and not args.cluster:
        raise CheckError("--kubeconfig applies only with --cluster")
    if args.exclude and args.cluster:
        raise CheckError("--exclude applies only to PATH arguments, not to --cluster")
    if args.paths.count("-") > 1:
        raise CheckError("stdin (-) can be read only once")
    if args.namespace is not None and not _NAMESPACE.match(args.namespace):
        raise CheckError(f"--namespace {args.namespace!r} is not a namespace name (lowercase RFC 1123 label)")


def _error(message: str) -> None:
    print(f"gpu-fence-webhook check: error: {message}", file=sys.stderr)


def _warn(message: str) -> None:
    print(f"gpu-fence-webhook check: warning: {message}", file=sys.stderr)


def load_policy(path: str | None) -> PolicyConfig:
    """The policy to judge with: ``--config``, else the policy the manifests ship (:data:`SHIPPED_POLICY`), so that
    check and the webhook installed from ``manifests/`` agree (gpu-fence's own pods are exempt in both). Without
    that file (an install that lost it), the built-in defaults, said loudly: they exempt only ``kube-system``."""
    if path is not None:
        return load_config(path)
    shipped = resources.files(__package__).joinpath(SHIPPED_POLICY)
    if not shipped.is_file():
        print(
            f"gpu-fence-webhook check: warning: {SHIPPED_POLICY} (the policy the manifests ship) is not installed; "
            "judging with the built-in defaults, which exempt only kube-system: pass --config FILE",
            file=sys.stderr,
        )
        return load_config(None)
    with resources.as_file(shipped) as file:
        return load_config(str(file))


def _wants_colour(stream: IO[str]) -> bool:
    if "NO_COLOR" in os.environ:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def render(report: Report, output_format: str, *, colour: bool = False) -> str:
    if output_format == "json":
        return render_json(report)
    if output_format == "junit":
        return render_junit(report)
    if output_format == "sarif":
        return render_sarif(report, policy.RULES, tool_version=package_version())
    if output_format == "openreports":
        # a result per rule and pod spec: not for the rules only a pod UPDATE can break, which check never judges
        judged = tuple(rule for rule in policy.RULES if rule.id not in policy.UPDATE_RULES)
        return render_openreports(report, judged, now_ns=time.time_ns())
    return render_text(report, colour=colour)


# --- files ------------------------------------------------------------------------------------------------


#: How deep manifests held in strings are followed (an Argo workflow whose resource template creates a workflow...).
MAX_EMBEDDING_DEPTH = 4


@dataclass
class Checked:
    """What a check over files gathered: the results, the documents that held no object, what it could not read
    (``errors``: no report is written) and what it set aside and says on stderr (``notes``)."""

    sources: tuple[Source, ...] = ()
    results: list[PodSpecResult] = field(default_factory=list)
    documents: int = 0
    skipped: int = 0
    charts: int = 0
    excluded: int = 0
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: bytes of manifests held in strings read for the current document (aliases can repeat one string many times)
    embedded_bytes: int = 0

    def report(self) -> Report:
        return Report(tuple(self.results), self.skipped)

    def describe(self) -> str:
        """What was read, in words, for the message that says no pod spec was found."""
        kinds = Counter(source.kind for source in self.sources)
        parts = [
            _count(kinds[SourceKind.FILE], "file"),
            _count(kinds[SourceKind.KUSTOMIZATION], "rendered kustomization"),
            "stdin" if kinds[SourceKind.STDIN] else "",
        ]
        read = ", ".join(part for part in parts if part) or "nothing"
        documents = _count(self.documents, "document") or "no documents"
        not_objects = f", {self.skipped} not Kubernetes objects" if self.skipped else ""
        set_aside = [
            _count(self.charts, "Helm chart") + " not rendered" if self.charts else "",
            f"{self.excluded} excluded" if self.excluded else "",
        ]
        aside = "".join(f", {part}" for part in set_aside if part)
        return f"{read} ({documents}{not_objects}){aside}"


def _count(number: int, noun: str) -> str:
    return "" if not number else f"{number} {noun}" + ("" if number == 1 else "s")


def check_paths(
    paths: Iterable[str],
    config: PolicyConfig,
    default_namespace: str,
    excludes: Sequence[str] = (),
    stdin: IO[bytes] | None = None,
) -> Checked:
    """Check every pod spec in the sources the paths name, reading one document at a time (memory holds one
    document and the results). Every source that cannot be read is in ``errors``, each once."""
    found = find_sources(paths, excludes)
    checked = Checked(found.sources, charts=len(found.charts), excluded=found.excluded, errors=list(found.errors))
    checked.notes.extend(
        f"{chart}: a Helm chart, not checked: its templates are not manifests; render it: "
        f"helm template {chart} | gpu-fence-webhook check -"
        for chart in found.charts
    )
    for source in found.sources:
        try:
            for document in read_source(source, stdin):
                _check_document(checked, document, config, default_namespace)
        except SourceError as error:
            checked.errors.append(str(error))
    return checked


@dataclass(frozen=True)
class _Origin:
    """For a document read from a string inside an object (an embedded manifest): that object, which the report
    names, and the path to the string (``spec.templates[1].resource.manifest``) that prefixes each result's path."""

    kind: str
    api_version: str
    name: str
    line: int
    path: str
    depth: int


def _check_document(
    checked: Checked,
    document: Document,
    config: PolicyConfig,
    default_namespace: str,
    origin: _Origin | None = None,
) -> None:
    if origin is None:
        checked.documents += 1
        checked.embedded_bytes = 0
    for relative, obj in iter_objects(document.data):
        if obj is None:
            checked.skipped += 1
            continue
        line = document.line_of(relative)
        try:
            sites = find_pod_specs(obj)
        except DiscoveryError as error:
            raise SourceError(f"{document.source}:{line}: {error}") from None
        namespace = object_namespace(obj, default_namespace)
        for site in sites:
            checked.results.append(
                _evaluate_site(
                    document,
                    relative=relative,
                    line=line,
                    obj=obj,
                    site=site,
                    namespace=namespace,
                    config=config,
                    origin=origin,
                )
            )
        for manifest in find_embedded_manifests(obj):
            _check_embedded(
                checked,
                document,
                relative=relative,
                obj=obj,
                manifest=manifest,
                config=config,
                namespace=namespace,
                origin=origin,
            )


def _check_embedded(
    checked: Checked,
    document: Document,
    *,
    relative: tuple[str | int, ...],
    obj: Mapping[str, Any],
    manifest: EmbeddedManifest,
    config: PolicyConfig,
    namespace: str,
    origin: _Origin | None,
) -> None:
    """The objects of a manifest held in a string (an Argo resource template's), checked as if they were written
    out, each result named after the object that holds the string; what cannot be read is a note and a skip."""
    where = (*relative, *manifest.path)
    line = document.line_of(where)
    label = _join_paths(origin.path if origin else "", format_path(where if origin else manifest.path))
    if not manifest.creates_objects:
        if manifest.action == "patch":
            checked.notes.append(
                f"{document.source}:{line}: {label} is a patch (action: patch), not checked: check the object it "
                "patches"
            )
        return
    depth = origin.depth + 1 if origin else 1
    checked.embedded_bytes += len(manifest.text)
    if depth > MAX_EMBEDDING_DEPTH:
        unread = f"manifests held in strings more than {MAX_EMBEDDING_DEPTH} deep"
    elif checked.embedded_bytes > MAX_DOCUMENT_BYTES:  # one string repeated through aliases, read again each time
        unread = f"the manifests held in strings of one document pass {MAX_DOCUMENT_BYTES / 2**20:g} MiB in all"
    else:
        unread = ""
    if unread:
        checked.skipped += 1
        checked.notes.append(f"{document.source}:{line}: {label} not checked: {unread}")
        return
    try:
        documents = parse_documents(
            manifest.text, document.source, rendered=document.rendered, embedding=document.embedding_at(where)
        )
    except SourceError as error:
        checked.skipped += 1
        why = " (Argo substitutes {{...}} parameters only when it runs: quote them)" if "{{" in manifest.text else ""
        checked.notes.append(f"{error}; the manifest of {label} is not checked{why}")
        return
    outer = origin or _Origin(
        str(obj.get("kind")), str(obj.get("apiVersion")), object_name(obj), document.line_of(relative), "", 0
    )
    for number, inner in enumerate(documents, 1):
        path = f"{label}#{number}" if len(documents) > 1 else label
        inner_origin = _Origin(outer.kind, outer.api_version, outer.name, outer.line, path, depth)
        _check_document(checked, inner, config, namespace, inner_origin)


def _join_paths(outer: str, inner: str) -> str:
    return f"{outer} > {inner}" if outer and inner else outer or inner


def _evaluate_site(
    document: Document,
    *,
    relative: tuple[str | int, ...],
    line: int,
    obj: Mapping[str, Any],
    site: PodSpecSite,
    namespace: str,
    config: PolicyConfig,
    origin: _Origin | None = None,
) -> PodSpecResult:
    decision = policy.evaluate(pod_for_site(site, obj, namespace), config, namespace=namespace)
    spec_line = document.line_of((*relative, *site.path))

    def finding_line(rule: str, container: str | None) -> int:
        located = site.container_path(container)
        if located is not None:
            return document.line_of((*relative, *located), spec_line)
        if rule in _TEMPLATE_FIELDS:
            return document.line_of((*relative, *site.path, *_TEMPLATE_FIELDS[rule]), spec_line)
        if rule in _SPEC_FIELDS:
            return document.line_of((*relative, *site.spec_path, *_SPEC_FIELDS[rule]), spec_line)
        return spec_line

    if origin is None:
        kind, api_version, name = str(obj.get("kind")), str(obj.get("apiVersion")), object_name(obj)
        path = format_path(site.path)
    else:  # named after the object that holds the manifest, the path leading through the string into it
        kind, api_version, name, line = origin.kind, origin.api_version, origin.name, origin.line
        path = _join_paths(origin.path, format_path((*relative, *site.path)))
    return _result(
        decision,
        source=document.source,
        line=line,
        kind=kind,
        api_version=api_version,
        namespace=namespace,
        name=name,
        path=path,
        spec_line=spec_line,
        finding_line=finding_line,
        rendered=document.rendered,
    )


def _result(decision: Decision, *, finding_line: Callable[[str, str | None], int], **fields: Any) -> PodSpecResult:
    violations = tuple(
        Finding(
            violation.rule, violation.container, violation.detail, finding_line(violation.rule, violation.container)
        )
        for violation in decision.validation.violations
    )
    return PodSpecResult(
        verdict=decision.verdict,
        pinned=tuple(decision.mutation.pinned),
        violations=violations,
        warnings=tuple(
            Finding(warning.rule, warning.container, warning.detail, finding_line(warning.rule, warning.container))
            for warning in decision.validation.warnings
        ),
        exempt_reason=decision.exempt,
        **fields,
    )


# --- live cluster -----------------------------------------------------------------------------------------


def check_pods(pods: Iterable[Mapping[str, Any]], config: PolicyConfig) -> Report:
    """Evaluate live pods, each in its own namespace, as the webhook would on their creation.

    A live pod's ``spec.nodeName`` is the scheduler's binding, set after creation for nearly every pod, so it is
    read as absent: the policy's question about it (was the pod created bound to a node, past any scheduler?) is
    one only admission can answer.
    """
    results: list[PodSpecResult] = []
    skipped = 0
    for pod in pods:
        spec = pod.get("spec")
        if not isinstance(spec, Mapping):
            skipped += 1
            continue
        namespace = object_namespace(pod, DEFAULT_NAMESPACE)
        created = {**pod, "spec": {key: value for key, value in spec.items() if key != "nodeName"}}
        decision = policy.evaluate(created, config, namespace=namespace)
        results.append(
            _result(
                decision,
                source=CLUSTER_SOURCE,
                line=0,
                kind="Pod",
                api_version="v1",
                uid=_uid(pod),
                namespace=namespace,
                name=object_name(pod),
                path="",
                finding_line=lambda _rule, _container: 0,
            )
        )
    return Report(tuple(results), skipped)


def _uid(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata")
    uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
    return uid if isinstance(uid, str) else ""


def list_cluster_pods(namespace: str | None, kubeconfig: str | None) -> list[dict[str, Any]]:
    """Every pod of the cluster (or of one namespace) as plain dicts, read in pages.

    The ``kubernetes`` client is imported here, not at module level: ``serve`` must never load it.
    Responses are decoded as JSON rather than into the client's model classes, so pods keep their API
    field names (``initContainers``, not ``init_containers``), as the policy expects.
    """
    from kubernetes import client  # noqa: PLC0415 - slow to import; only this path needs it
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415
    from urllib3.exceptions import HTTPError  # noqa: PLC0415

    try:
        configuration = load_configuration(kubeconfig)
    except KubeConfigError as error:
        raise ClusterError(f"cannot load Kubernetes configuration from {error.source}: {error.reason}") from None
    configuration.retries = 1  # fail fast and clearly on an unreachable API instead of retrying silently
    api = client.CoreV1Api(client.ApiClient(configuration))
    pods: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": CLUSTER_PAGE_SIZE, "_preload_content": False, "_request_timeout": (10, 60)}
        if token:
            kwargs["_continue"] = token
        # With _preload_content=False the client returns the raw urllib3 response, not the V1PodList it declares.
        response: Any
        try:
            if namespace:
                response = api.list_namespaced_pod(namespace, **kwargs)
            else:
                response = api.list_pod_for_all_namespaces(**kwargs)
            body = json.loads(response.data)
        except ApiException as error:
            raise ClusterError(
                f"the Kubernetes API at {configuration.host} refused to list pods: "
                f"{error.status} {error.reason}{_api_message(error.body)}"
            ) from None
        except HTTPError as error:
            reason = getattr(error, "reason", None) or error
            raise ClusterError(f"cannot reach the Kubernetes API at {configuration.host}: {reason}") from None
        except ValueError as error:
            raise ClusterError(
                f"the Kubernetes API at {configuration.host} sent a pod list that is not JSON: {error}"
            ) from None
        items = body.get("items") if isinstance(body, Mapping) else None
        if not isinstance(items, list):
            raise ClusterError(f"the Kubernetes API at {configuration.host} sent a pod list without items")
        for item in items:
            if isinstance(item, Mapping):
                pods.append({"apiVersion": "v1", "kind": "Pod", **item})
        metadata = body.get("metadata")
        token = metadata.get("continue") if isinstance(metadata, Mapping) else None
        if not token:
            return pods


def _api_message(body: Any) -> str:
    """The ``message`` of a Kubernetes Status body, which says why (e.g. which RBAC verb is missing)."""
    try:
        status = json.loads(body) if body else None
    except (TypeError, ValueError):
        return ""
    message = status.get("message") if isinstance(status, Mapping) else None
    return f": {message}" if isinstance(message, str) and message else ""
