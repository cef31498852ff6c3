"""GPU prices: one YAML file (or one flat ``--price-per-gpu-hour``) → a frozen :class:`Prices`.

The price is per physical card and hour. A MIG slice costs its share of its card's price, so only cards are
priced. Lookup order, most specific first: the node (an exact name, then ``fnmatch`` patterns in file order),
then the GPU model as NVML names it (``gpu_fence_gpu_info{model}``), then ``default``::

    currency: USD
    default: 2.50
    models:
      "NVIDIA H100 80GB HBM3": 4.00
    nodes:
      "spot-gpu-*": 1.10
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from .errors import ChargebackError
from .files import named_entries, read_yaml

_KEYS = ("currency", "default", "models", "nodes")
# NVML names a MIG device "<card model> MIG 3g.40gb"; the card's own name is what a price list holds.
_MIG_SUFFIX = re.compile(r"\s+MIG\s+\S+$")


def card_model(model: str) -> str:
    """The card a device's model names: a MIG device's model without its profile suffix."""
    return _MIG_SUFFIX.sub("", model)


class PriceError(ChargebackError):
    """The price file cannot be used; the message names the file and the key to fix."""


@dataclass(frozen=True)
class Prices:
    default: float | None = None
    models: tuple[tuple[str, float], ...] = ()
    nodes: tuple[tuple[str, float], ...] = ()
    currency: str = "USD"

    flat_price: bool = False  # one --price-per-gpu-hour for every card, rather than a file

    @classmethod
    def flat(cls, per_gpu_hour: float) -> Prices:
        if not math.isfinite(per_gpu_hour) or per_gpu_hour < 0:
            raise PriceError(f"--price-per-gpu-hour must be a number >= 0, got {per_gpu_hour}")
        return cls(default=float(per_gpu_hour), flat_price=True)

    def match(self, node: str, model: str) -> PriceMatch | None:
        """The price of a whole card of ``model`` on ``node`` and the entry it came from; None when none matches."""
        for pattern, price in self.nodes:
            if pattern == node:
                return PriceMatch(price, PriceRule(PriceKey.NODE, pattern))
        for pattern, price in self.nodes:
            if fnmatch.fnmatchcase(node, pattern):
                return PriceMatch(price, PriceRule(PriceKey.NODE, pattern))
        of_card = card_model(model)
        for name, price in self.models:
            if name in (model, of_card):
                return PriceMatch(price, PriceRule(PriceKey.MODEL, name))
        if self.default is None:
            return None
        return PriceMatch(self.default, PriceRule(PriceKey.FLAT if self.flat_price else PriceKey.DEFAULT))

    def per_hour(self, node: str, model: str) -> float | None:
        """Hourly price of a whole card of ``model`` on ``node``; None when nothing in the list matches."""
        found = self.match(node, model)
        return None if found is None else found.price


class PriceKey(Enum):
    """Which part of the price list a price came from."""

    NODE = "nodes"  # an exact node name or an fnmatch pattern
    MODEL = "models"
    DEFAULT = "default"
    FLAT = "--price-per-gpu-hour"


@dataclass(frozen=True)
class PriceRule:
    """The entry of the price list that priced a card: its part, and the name or pattern within it."""

    key: PriceKey
    name: str = ""

    @property
    def entry(self) -> str:
        """The entry as the price file spells it: ``nodes.'spot-*'``, ``models.'NVIDIA L4'``, ``default``."""
        return f"{self.key.value}.{self.name!r}" if self.name else self.key.value

    @property
    def described(self) -> str:
        """The entry in words, for readers who never saw the price file."""
        if self.key is PriceKey.NODE:
            return f"nodes named {self.name}" if any(char in self.name for char in "*?[") else f"node {self.name}"
        if self.key is PriceKey.MODEL:
            return "its model"
        if self.key is PriceKey.DEFAULT:
            return "the default price"
        return "one price for every card"


@dataclass(frozen=True)
class PriceMatch:
    price: float
    rule: PriceRule


@dataclass(frozen=True)
class AppliedPrice:
    """One line of the price list as a bill applied it: which entry priced which model, and how many cards."""

    rule: PriceRule
    model: str
    price: float
    cards: int


def applied_prices(prices: Prices, cards: Iterable[tuple[str, str]]) -> tuple[AppliedPrice, ...]:
    """The entries of ``prices`` that priced ``cards`` (node, model), one per (entry, model, price)."""
    counts: Counter[tuple[PriceRule, str, float]] = Counter()
    for node, model in cards:
        found = prices.match(node, model)
        if found is not None:
            counts[(found.rule, model, found.price)] += 1
    ordered = sorted(counts.items(), key=lambda item: (item[0][0].entry, *item[0][1:]))
    return tuple(AppliedPrice(rule, model, price, count) for (rule, model, price), count in ordered)


def _price(value: Any, where: str, source: str) -> float:
    # bool is an int in Python; "yes" as a price is a typo, not 1.0.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise PriceError(f"{source}: {where} must be a number >= 0 (price per GPU-hour), got {value!r}")
    return float(value)


def _table(value: Any, key: str, source: str) -> tuple[tuple[str, float], ...]:
    def fail(message: str) -> PriceError:
        return PriceError(f"{source}: {message}")

    return named_entries(value, key, "price per GPU-hour", lambda item, where: _price(item, where, source), fail)


def prices_from_mapping(document: Any, source: str = "prices") -> Prices:
    """Validate a parsed price document; every error names the key to fix."""
    if not isinstance(document, Mapping):
        raise PriceError(f"{source}: expected a mapping with keys {', '.join(_KEYS)}, got {type(document).__name__}")
    unknown = sorted(str(key) for key in document if key not in _KEYS)
    if unknown:
        raise PriceError(f"{source}: unknown key {unknown[0]!r} (allowed: {', '.join(_KEYS)})")
    default = document.get("default")
    currency = document.get("currency", "USD")
    if not isinstance(currency, str) or not currency.strip():
        raise PriceError(f"{source}: currency must be a non-empty string such as USD, got {currency!r}")
    prices = Prices(
        default=None if default is None else _price(default, "default", source),
        models=_table(document.get("models"), "models", source),
        nodes=_table(document.get("nodes"), "nodes", source),
        currency=currency.strip(),
    )
    if prices.default is None and not prices.models and not prices.nodes:
        raise PriceError(f"{source}: no prices: set default, models or nodes")
    return prices


def load_prices(path: Path) -> Prices:
    document = read_yaml(path, f"price file {path}", PriceError)
    return prices_from_mapping(document, source=f"price file {path}")
