"""The offline check's results and four ways to print them: text, json, junit and sarif (``openreports`` is the fifth,
in ``webhook.openreports``).

Renderers are pure: a :class:`Report` in, a string out. The ``json`` layout is a contract other tools read
(see ``docs/check.md``); ``junit`` gives CI one test case per pod spec; ``sarif`` 2.1.0 feeds code scanning,
one result per violation, located at the offending container's line.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import PurePath
from typing import Any, Protocol

from gpu_fence.verdicts import Verdict

#: Output formats of ``gpu-fence-webhook check``.
FORMATS = ("text", "json", "junit", "sarif", "openreports")

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
TOOL_NAME = "gpu-fence"


class RuleInfo(Protocol):
    """What the SARIF renderer needs of a policy rule (``webhook.policy.Rule`` has these)."""

    @property
    def id(self) -> str: ...

    @property
    def summary(self) -> str: ...

    @property
    def vectors(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class Finding:
    """A violation, or a warning, as the reports show it: its rule id, its container (None for the pod), its text
    without the rule id (what is wrong, the fix, the way out) and the line that reports point at (the container's,
    when known)."""

    rule: str
    container: str | None
    detail: str
    line: int

    @property
    def message(self) -> str:
        return f"{self.rule}: {self.detail}"


@dataclass(frozen=True)
class PodSpecResult:
    """The verdict for one pod spec found in a source.

    ``line`` is where the object holding the pod spec starts (1-based; 0 for live pods, which have no
    file); ``spec_line`` is where the pod spec itself (its template) starts.
    """

    source: str
    line: int
    kind: str
    namespace: str
    name: str
    path: str
    verdict: Verdict
    api_version: str = ""
    uid: str = ""  # of a live pod
    pinned: tuple[str, ...] = ()
    violations: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()  # each with its rule id: OpenReports reports it as a warned rule
    exempt_reason: str | None = None
    spec_line: int = 0
    #: from a rendered kustomization: lines are those of the rendered stream, which no file holds
    rendered: bool = False


@dataclass(frozen=True)
class Report:
    """All results of one check run, plus how many documents were not Kubernetes objects."""

    results: tuple[PodSpecResult, ...]
    skipped: int = 0

    def count(self, verdict: Verdict) -> int:
        return sum(1 for result in self.results if result.verdict == verdict)

    @property
    def rejected(self) -> bool:
        return any(result.verdict is Verdict.REJECTED for result in self.results)

    def summary(self) -> dict[str, int]:
        counts = {"pod_specs": len(self.results)}
        counts.update((verdict.value, self.count(verdict)) for verdict in Verdict)
        counts["skipped"] = self.skipped
        return counts


# --- json -------------------------------------------------------------------------------------------------


def result_to_dict(result: PodSpecResult) -> dict[str, Any]:
    """One entry of the json ``results`` list (the contract documented in ``docs/check.md``)."""
    return {
        "source": result.source,
        "line": result.line,
        "kind": result.kind,
        "namespace": result.namespace,
        "name": result.name,
        "path": result.path,
        "verdict": result.verdict.value,
        "pinned": list(result.pinned),
        "violations": [
            {"rule": finding.rule, "container": finding.container, "message": finding.message}
            for finding in result.violations
        ],
        "warnings": [warning.message for warning in result.warnings],
    }


def render_json(report: Report) -> str:
    document = {"summary": report.summary(), "results": [result_to_dict(result) for result in report.results]}
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


# --- text -------------------------------------------------------------------------------------------------

_COLOURS = {
    Verdict.ALLOWED: "32",
    Verdict.MUTATED: "36",
    Verdict.REJECTED: "1;31",
    Verdict.EXEMPT: "2",
    "warning": "33",
    "dim": "2",
}


def _paint(text: str, style: str, colour: bool) -> str:
    return f"\x1b[{_COLOURS[style]}m{text}\x1b[0m" if colour else text


def _describe(result: PodSpecResult) -> str:
    where = f"{result.namespace}/{result.name}" if result.name else result.namespace
    path = f" {result.path}" if result.path else ""
    line = f" (line {result.line})" if result.line else ""
    return f"{result.kind} {where}{path}{line}"


def summary_line(report: Report) -> str:
    counts = report.summary()
    noun = "pod spec" if counts["pod_specs"] == 1 else "pod specs"
    parts = ", ".join(f"{counts[verdict]} {verdict}" for verdict in Verdict)
    skipped = counts["skipped"]
    tail = f"; {skipped} skipped (not Kubernetes objects)" if skipped else ""
    return f"{counts['pod_specs']} {noun}: {parts}{tail}"


def render_text(report: Report, *, colour: bool = False) -> str:
    """A report for people: grouped by source, one line per pod spec, details indented under it."""
    lines: list[str] = []
    for source, group in groupby(report.results, key=lambda result: result.source):
        lines.append(_paint(source, "dim", colour))
        for result in group:
            lines.append(f"  {_paint(f'{result.verdict:<8}', result.verdict, colour)}  {_describe(result)}")
            if result.exempt_reason:
                lines.append(f"            exempt: {result.exempt_reason}")
            if result.pinned:
                lines.append(f"            pinned NVIDIA_VISIBLE_DEVICES=void on: {', '.join(result.pinned)}")
            for finding in result.violations:
                where = f"line {finding.line}: " if finding.line else ""
                lines.append(f"            {where}{_paint(finding.rule, 'rejected', colour)}: {finding.detail}")
            for warning in result.warnings:
                lines.append(f"            {_paint('warning', 'warning', colour)}: {warning.message}")
        lines.append("")
    lines.append(summary_line(report))
    return "\n".join(lines) + "\n"


# --- junit ------------------------------------------------------------------------------------------------


def _testcase_name(result: PodSpecResult) -> str:
    where = f"{result.namespace}/{result.name}" if result.name else result.namespace
    return f"{result.kind} {where}" + (f" {result.path}" if result.path else "")


def render_junit(report: Report) -> str:
    """JUnit XML: a test suite per source, a test case per pod spec, a failure per rejected pod spec.

    Exempt pod specs are reported as skipped; mutations are noted in ``system-out``.
    """
    suites = ET.Element("testsuites", name="gpu-fence check")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for source, group in groupby(report.results, key=lambda result: result.source):
        results = list(group)
        failures = sum(1 for result in results if result.verdict is Verdict.REJECTED)
        skipped = sum(1 for result in results if result.verdict is Verdict.EXEMPT)
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=source,
            tests=str(len(results)),
            failures=str(failures),
            errors="0",
            skipped=str(skipped),
        )
        totals["tests"] += len(results)
        totals["failures"] += failures
        totals["skipped"] += skipped
        for result in results:
            case = ET.SubElement(suite, "testcase", classname=source, name=_testcase_name(result))
            if result.line:
                case.set("file", source)
                case.set("line", str(result.line))
            if result.verdict is Verdict.REJECTED:
                rules = sorted({finding.rule for finding in result.violations})
                failure = ET.SubElement(case, "failure", type="rejected", message=f"rejected: {', '.join(rules)}")
                failure.text = "\n".join(
                    f"{finding.rule} [{finding.container or 'pod'}] line {finding.line}: {finding.message}"
                    for finding in result.violations
                )
            elif result.verdict is Verdict.EXEMPT:
                ET.SubElement(case, "skipped", message=f"exempt: {result.exempt_reason or 'exempt'}")
            notes = []
            if result.pinned:
                notes.append(f"mutated: pinned NVIDIA_VISIBLE_DEVICES=void on {', '.join(result.pinned)}")
            notes.extend(f"warning: {warning.message}" for warning in result.warnings)
            if notes:
                ET.SubElement(case, "system-out").text = "\n".join(notes)
    suites.set("tests", str(totals["tests"]))
    suites.set("failures", str(totals["failures"]))
    suites.set("errors", "0")
    suites.set("skipped", str(totals["skipped"]))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


# --- sarif ------------------------------------------------------------------------------------------------


def artifact_uri(source: str) -> str:
    """A SARIF artifact URI for a source: relative paths stay relative (code scanning resolves them against
    the repository root), absolute ones become ``file://`` URIs."""
    path = PurePath(source)
    if path.is_absolute():
        return path.as_uri()
    return source.replace(os.sep, "/")


def _sarif_location(result: PodSpecResult, line: int) -> dict[str, Any]:
    name = f"{result.kind}/{result.namespace}/{result.name}" + (f"/{result.path}" if result.path else "")
    logical = {"fullyQualifiedName": name, "kind": "object"}
    if line <= 0 or result.rendered:  # a live pod or a rendered kustomization: no file to point into
        return {"logicalLocations": [logical]}
    return {
        "physicalLocation": {"artifactLocation": {"uri": artifact_uri(result.source)}, "region": {"startLine": line}},
        "logicalLocations": [logical],
    }


def render_sarif(report: Report, rules: Iterable[RuleInfo], *, tool_version: str = "0") -> str:
    """SARIF 2.1.0 with ``tool.driver.rules`` from the policy's rules and one result per violation."""
    rule_list = list(rules)
    index = {rule.id: position for position, rule in enumerate(rule_list)}
    driver_rules = [
        {
            "id": rule.id,
            "name": rule.id,
            "shortDescription": {"text": rule.summary},
            "fullDescription": {"text": f"{rule.summary} (bypass vectors: {', '.join(rule.vectors)})"},
            "defaultConfiguration": {"level": "error"},
            "properties": {"tags": ["security", "gpu", *rule.vectors]},
        }
        for rule in rule_list
    ]
    results: list[dict[str, Any]] = []
    for result in report.results:
        for finding in result.violations:
            entry: dict[str, Any] = {
                "ruleId": finding.rule,
                "level": "error",
                "message": {"text": finding.message},
                "locations": [_sarif_location(result, finding.line)],
            }
            if finding.rule in index:
                entry["ruleIndex"] = index[finding.rule]
            results.append(entry)
    document = {
        "$schema": SARIF_SCHEMA,
        "version": SARIF_VERSION,
        "runs": [
            {
                "tool": {"driver": {"name": TOOL_NAME, "version": tool_version, "rules": driver_rules}},
                "results": results,
            }
        ],
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
