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
