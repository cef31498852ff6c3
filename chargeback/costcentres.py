"""Cost centres: which cost centre each group of a bill belongs to, from one YAML file (``--cost-centres FILE``).

Finance books GPU cost to cost centres, not to namespaces or team labels; this file says which is which, so that
every format carries the cost centre beside each row and sums the rows per cost centre::

    namespaces:                  # with --by namespace: a namespace, or an fnmatch pattern, to its cost centre
      genai: "4100 Research"
      "search-*": "4200 Search"
    labels:                      # with --by label:KEY: for each KEY, a value (or pattern) to its cost centre
      team:
        data-science: "4100 Research"
    unattributed: "9000 Platform"   # the (unattributed) row
    platform: "9000 Platform"       # the (platform) row
    default: "9999 Unassigned"      # a group nothing above names

Lookup per group, most specific first: the exact name, then patterns in file order, then ``default``. A group
nothing maps has no cost centre (the summary lists it under ``(no cost centre)``). Cost centres are strings:
YAML reads ``0410`` as the number 264, so a number is refused with the advice to quote it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ChargebackError
from .files import named_entries, read_yaml

_KEYS = ("namespaces", "labels", "unattributed", "platform", "default")
UNASSIGNED = "(no cost centre)"


class CostCentreError(ChargebackError):
    """The cost-centre file cannot be used; the message names the file and the key to fix."""


@dataclass(frozen=True)
class CostCentres:
    """The cost centre of each group, of the unattributed row and of the platform row (None: none given)."""

    groups: tuple[tuple[str, str], ...] = ()  # (name or fnmatch pattern, cost centre), in file order
    unattributed: str | None = None
    platform: str | None = None
    default: str | None = None
    file: str = ""  # the file, as the report names it; empty when none was given

    @property
    def given(self) -> bool:
        return bool(self.file)

    def of(self, group: str) -> str | None:
        for pattern, centre in self.groups:
            if pattern == group:
                return centre
        for pattern, centre in self.groups:
            if fnmatch.fnmatchcase(group, pattern):
                return centre
        return self.default


def _centre(value: Any, where: str, source: str) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise CostCentreError(f'{source}: {where} must be a string: quote it ("{value}"), YAML reads 0410 as 264')
    raise CostCentreError(f"{source}: {where} must be a non-empty string (the cost centre), got {value!r}")


def _mapping(value: Any, where: str, source: str) -> tuple[tuple[str, str], ...]:
    def fail(message: str) -> CostCentreError:
        return CostCentreError(f"{source}: {message}")

    return named_entries(value, where, "cost centre", lambda item, key: _centre(item, key, source), fail)


def cost_centres_from_mapping(document: Any, by: str, source: str = "cost centres", file: str = "-") -> CostCentres:
    """Validate a parsed document for a bill grouped ``by`` (``namespace`` or ``label:KEY``); every error names the
    key to fix. The section for the other grouping is checked too, and left unused."""
    if not isinstance(document, Mapping):
        raise CostCentreError(
            f"{source}: expected a mapping with keys {', '.join(_KEYS)}, got {type(document).__name__}"
        )
    unknown = sorted(str(key) for key in document if key not in _KEYS)
    if unknown:
        raise CostCentreError(f"{source}: unknown key {unknown[0]!r} (allowed: {', '.join(_KEYS)})")
    namespaces = _mapping(document.get("namespaces"), "namespaces", source)
    labels = document.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise CostCentreError(
            f"{source}: labels must be a mapping of pod label key to a mapping of value to cost centre"
        )
    by_label = {str(key): _mapping(value, f"labels.{key!r}", source) for key, value in labels.items()}
    if by == "namespace":
        groups = namespaces
    else:
        key = by.removeprefix("label:")
        groups = by_label.get(key, ())
    default = document.get("default")
    centres = CostCentres(
        groups=groups,
        unattributed=_optional(document.get("unattributed"), "unattributed", source),
        platform=_optional(document.get("platform"), "platform", source),
        default=_optional(default, "default", source),
        file=file,
    )
    if not groups and centres.default is None:
        wanted = "namespaces:" if by == "namespace" else f"labels: {{{by.removeprefix('label:')}: ...}}"
        raise CostCentreError(f"{source}: maps no group of a bill --by {by}: add {wanted} or default:")
    return centres


def _optional(value: Any, where: str, source: str) -> str | None:
    return None if value is None else _centre(value, where, source)


def load_cost_centres(path: Path, by: str) -> CostCentres:
    named = f"cost centres file {path}"
    return cost_centres_from_mapping(read_yaml(path, named, CostCentreError), by, source=named, file=str(path))
