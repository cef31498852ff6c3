"""The command's own input files (the price list, the cost centres, the HTTP client configuration): read whole,
parsed as YAML, every failure one line that names the file and, for YAML, the line or the key."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

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


T = TypeVar("T")


def named_entries(
    value: Any, key: str, what: str, read: Callable[[Any, str], T], error: Callable[[str], ChargebackError]
) -> tuple[tuple[str, T], ...]:
    """A mapping of names to ``what`` under ``key`` (absent: none), in file order, each value read by ``read(value,
    where)``; a key that is not a non-empty string, or a value that is not a mapping, is an ``error`` naming it."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise error(f"{key} must be a mapping of name to {what}, got {type(value).__name__}")
    entries = []
    for name, item in value.items():
        if not isinstance(name, str) or not name:
            raise error(f"{key} has a key {name!r} that is not a non-empty string (quote it)")
        entries.append((name, read(item, f"{key}.{name!r}")))
    return tuple(entries)
