"""The command's own input files (the price list, the HTTP client configuration): read whole, parsed as YAML,
every failure one line that names the file and, for YAML, the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import ChargebackError


def read_yaml(path: Path, named: str, error: type[ChargebackError]) -> Any:
    """The parsed document of ``path``; ``named`` is how messages call the file (``price file prices.yaml``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as failure:
        reason = getattr(failure, "strerror", None) or str(failure)
        raise error(f"cannot read {named}: {reason}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as failure:
        mark = getattr(failure, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise error(f"{named} is not valid YAML{where}: {getattr(failure, 'problem', None) or failure}") from None
