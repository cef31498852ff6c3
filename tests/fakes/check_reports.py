"""Reading ``gpu-fence-webhook check --format json`` reports in tests: where each pod spec was found and what became
of it, one tuple per result, so that a test compares a whole report's outcome in one assertion."""

from __future__ import annotations

from typing import Any

#: the fields of a result (docs/check.md) that place a pod spec and give its verdict
WHERE_AND_VERDICT = ("source", "line", "kind", "namespace", "name", "path", "verdict")


def where_and_verdict(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [tuple(result[key] for key in WHERE_AND_VERDICT) for result in report["results"]]
