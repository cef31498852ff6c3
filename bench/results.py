"""How every benchmark hands its figures out: a markdown table on stdout (what BENCHMARKS.md quotes) and, with
``--json FILE``, the same report as JSON, the machine's description included."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson


def publish(report: dict[str, Any], markdown: str, json_path: str | None) -> None:
    sys.stdout.write(markdown)
    if json_path:  # after minutes of measuring, a missing folder is made rather than the figures lost
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))


def target(goal: str, measured: str, met: bool) -> dict[str, Any]:
    """One of DESIGN's targets next to what this run measured (``met`` is a bool, for the JSON's readers)."""
    return {"target": goal, "measured": measured, "met": bool(met)}


def target_table(targets: list[dict[str, Any]]) -> list[str]:
    """The markdown lines every benchmark ends with: its targets, measured, met or not."""
    rows = [f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'NO'} |" for t in targets]
    return ["", "| target | measured | met |", "|---|---|---|", *rows]
