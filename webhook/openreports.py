"""``check --format openreports``: the check's results as OpenReports ``Report`` objects, one per namespace.

OpenReports (``openreports.io/v1alpha1``) is the report API that Policy Reporter reads and Kyverno moves to, for
results of policy engines and scanners alike. The objects follow its published definition, ``Report`` and
``ReportResult`` in ``apis/openreports.io/v1alpha1/report_types.go`` of openreports/reports-api (commit 769d978)
and the CRD generated from it, ``config/crd/openreports.io_reports.yaml``:

* ``Report`` is namespaced: one per namespace the check judged, named :data:`REPORT_NAME`, so that applying a
  later run replaces the earlier one; ``source`` is ``gpu-fence`` and ``summary`` counts the results.
* one ``ReportResult`` per pod spec and rule: ``policy`` (the only field the CRD requires) is ``gpu-fence``,
  ``rule`` the rule id; ``result`` is ``fail`` for a rule the pod spec breaks, ``warn`` for one it is warned about
  (a rule whose switch is at ``warn``, a node rule out of ``gpu_node_taints``' scope, the ``nvidia-runtime-class``
  advice), ``pass`` for one it keeps, ``skip`` for every rule of an exempt pod spec (``summary`` counts each);
  ``resources`` names the object that holds the pod spec, and ``properties`` where it was found. ``timestamp``
  carries both ``seconds`` and ``nanos``, which the CRD requires together.

Pure: a :class:`Report` of the check in, a YAML stream out (``kubectl apply -f -`` reads it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import groupby
from typing import Any, Protocol

import yaml

from gpu_fence.verdicts import Verdict

from .reports import PodSpecResult, Report

__all__ = ["API_VERSION", "POLICY", "REPORT_NAME", "render_openreports", "reports"]

API_VERSION = "openreports.io/v1alpha1"
#: ``source`` of every report, and ``policy`` of every result: the admission policy, whose rules are the results'.
POLICY = "gpu-fence"
SOURCE = "gpu-fence"
#: One report per namespace, under one name: a later run, applied, replaces the earlier one.
REPORT_NAME = "gpu-fence-check"
#: What ``kubectl delete reports -l`` or ``kubectl apply --prune -l`` select the check's reports by.
LABELS = {"app.kubernetes.io/managed-by": "gpu-fence", "app.kubernetes.io/name": "gpu-fence-check"}
#: Every rule is a path around GPU isolation and metering; the CRD's enum: critical, high, low, medium, info.
SEVERITY = "high"
CATEGORY = "GPU isolation"
OUTCOMES = ("pass", "fail", "warn", "error", "skip")


class RuleInfo(Protocol):
    """What a result needs of a policy rule (``webhook.policy.Rule`` has it)."""

    @property
    def id(self) -> str: ...


def reports(report: Report, rules: Iterable[RuleInfo], *, now_ns: int) -> list[dict[str, Any]]:
    """One ``Report`` object per namespace of ``report`` (sorted by namespace); ``now_ns`` is the results' time,
    in Unix nanoseconds."""
    rule_ids = [str(rule.id) for rule in rules]  # plain strings: YAML's safe dumper writes no str subclass
    seconds, nanos = divmod(now_ns, 1_000_000_000)
    timestamp = {"seconds": seconds, "nanos": nanos}
    by_namespace = sorted(report.results, key=lambda result: result.namespace)
    objects = []
    for namespace, group in groupby(by_namespace, key=lambda result: result.namespace):
        results = [entry for result in group for entry in _results(result, rule_ids, timestamp)]
        summary = {outcome: sum(1 for entry in results if entry["result"] == outcome) for outcome in OUTCOMES}
        objects.append(
            {
                "apiVersion": API_VERSION,
                "kind": "Report",
                "metadata": {"name": REPORT_NAME, "namespace": namespace, "labels": dict(LABELS)},
                "source": SOURCE,
                "summary": summary,
                "results": results,
            }
        )
    return objects


def render_openreports(report: Report, rules: Iterable[RuleInfo], *, now_ns: int) -> str:
    """The reports as one YAML stream, for ``kubectl apply -f -``."""
    return yaml.safe_dump_all(reports(report, rules, now_ns=now_ns), sort_keys=False, allow_unicode=True, width=120)


def _results(result: PodSpecResult, rule_ids: Sequence[str], timestamp: Mapping[str, int]) -> list[dict[str, Any]]:
    broken: dict[str, list[str]] = {}
    for finding in result.violations:
        broken.setdefault(finding.rule, []).append(finding.message)
    warned: dict[str, list[str]] = {}
    for warning in result.warnings:
        warned.setdefault(warning.rule, []).append(warning.message)
    extra = [str(rule) for rule in (*broken, *warned) if rule not in rule_ids]
    entries = []
    for rule in [*rule_ids, *dict.fromkeys(extra)]:
        if result.verdict is Verdict.EXEMPT:
            outcome, message = "skip", f"exempt: {result.exempt_reason or 'exempt'}"
        elif rule in broken:
            outcome, message = "fail", "; ".join(broken[rule])
        elif rule in warned:
            outcome, message = "warn", "; ".join(warned[rule])
        else:
            outcome, message = "pass", f"{rule}: no violation"
        entries.append(
            {
                "source": SOURCE,
                "policy": POLICY,
                "rule": rule,
                "category": CATEGORY,
                "severity": SEVERITY,
                "timestamp": dict(timestamp),
                "result": outcome,
                "scored": True,
                "resources": [_reference(result)],
                "message": message,
                "properties": _properties(result),
            }
        )
    return entries


def _reference(result: PodSpecResult) -> dict[str, str]:
    """The ``corev1.ObjectReference`` of the object that holds the pod spec."""
    reference = {"apiVersion": result.api_version} if result.api_version else {}
    reference.update(kind=result.kind, namespace=result.namespace, name=result.name)
    if result.uid:
        reference["uid"] = result.uid
    return reference


def _properties(result: PodSpecResult) -> dict[str, str]:
    """Where the pod spec is and what the check did to it; the CRD's ``properties`` holds strings only."""
    properties = {"verdict": result.verdict.value, "source": result.source}
    if result.path:
        properties["path"] = result.path
    if result.line:
        properties["line"] = str(result.line)
    if result.pinned:
        properties["pinned"] = ", ".join(result.pinned)
    if result.warnings:
        properties["warnings"] = " | ".join(warning.message for warning in result.warnings)
    return properties
