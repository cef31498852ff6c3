"""gpu_fence.metric_names is the one spelling of the auditor's series: the exporter declares exactly these families
and docs/metrics.md documents each; chargeback's code names no series of the auditor by hand."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gpu_fence import metric_names
from gpu_fence.auditor.metrics import AuditorMetrics

REPO = Path(__file__).resolve().parents[2]
DECLARED = {value for name, value in vars(metric_names).items() if name.isupper() and isinstance(value, str)}


def test_the_exporter_declares_exactly_the_named_series() -> None:
    """Every family the registry describes (present before any audit, with no samples yet), but the cycle's own."""
    exported = {family.name for family in AuditorMetrics("n", ["team"]).registry.collect()}
    per_audit = {name for name in exported if not name.startswith(("gpu_fence_audit_", "gpu_fence_dra_slices"))}
    assert per_audit == DECLARED


def test_every_named_series_is_documented() -> None:
    documented = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert {name for name in DECLARED if f"`{name}" not in documented} == set()


def strings_in_code(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module (f-strings' literal parts too), its docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_chargeback_spells_no_series_of_the_auditor_in_its_code() -> None:
    spelled = [
        f"{path.name}:{line}: {name}"
        for path in sorted((REPO / "chargeback").glob("*.py"))
        for line, text in strings_in_code(path)
        for name in DECLARED
        if re.search(rf"\b{name}\b", text)
    ]
    assert spelled == []
