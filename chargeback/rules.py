"""The chargeback recording rules: the per-interval split of ``ledger.py``, written in PromQL.

At every evaluation the rules book each GPU's or MIG slice's share of a card, as ``ledger.split_unit`` does for one
interval, to the containers that hold or use it (``container:...``), to the processes outside any container and
to idle capacity (``gpu:...``), for both methods; ``card:...`` says which cards existed and the model each is
priced by. Values are *card ratios*: the fraction of one physical card's cost over the evaluation interval
(a 3g slice of a 7-slice card, wholly used, is 3/7). A month's bill is then ``sum_over_time`` over these series
(``recorded.py``), priced per card by the price list; the idle policies work on those sums, so they need no rule.

Every rule of the split reads only the auditor's raw series, never another rule's output: each expression stands
alone, so it gives the same answer whether Prometheus, Thanos Ruler or Mimir's ruler evaluates it, in any group
order, and when ``promtool tsdb create-blocks-from rules`` backfills it (which evaluates one level of rules at a
time). The price is that shared parts (the units, the memory in use, the reservations) are spelled out again in
each rule; :class:`_Parts` writes each part once. A second group, ``hourly_rules``, sums an hour of the split's
series at a time, so that a month's bill reads twelve times fewer samples: it reads the split's output, waits an
interval before it does, and records an hour only when the hour is whole. The rules file in
``manifests/overlays/prometheus/`` is ``rules_file()``'s output; a test keeps it so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from gpu_fence import metric_names
from gpu_fence.metric_names import label_name

from .bill import Charge, Method
from .ledger import ROUNDING
from .prices import Prices

GROUP = "gpu-fence-chargeback-split"
HOURLY_GROUP = "gpu-fence-chargeback-hourly"
PRICE_GROUP = "gpu-fence-chargeback-prices"
DEFAULT_INTERVAL = 300.0  # seconds: the resolution a month's bill is made at (docs/chargeback.md, "Which path")

# What the rules record; names follow Prometheus' level:metric:operations. Keep them stable: dashboards use them.
INTERVAL = "gpu_fence:chargeback_rules_interval:seconds"
CARD = "card:gpu_fence_chargeback_card:info"
BOOKED = "gpu_container:gpu_fence_chargeback_booked:card_ratio"
MEMORY = "gpu_container:gpu_fence_chargeback_memory:bytes"
REQUESTED = "gpu_container:gpu_fence_chargeback_requested:card_ratio"
GROUP_BOOKED = "gpu_namespace:gpu_fence_chargeback_booked:card_ratio"
GROUP_MEMORY = "gpu_namespace:gpu_fence_chargeback_memory:bytes"
GROUP_REQUESTED = "gpu_namespace:gpu_fence_chargeback_requested:card_ratio"
UNATTRIBUTED = "gpu:gpu_fence_chargeback_unattributed:card_ratio"
UNATTRIBUTED_MEMORY = "gpu:gpu_fence_chargeback_unattributed_memory:bytes"
IDLE = "gpu:gpu_fence_chargeback_idle:card_ratio"
ISSUE = "gpu:gpu_fence_chargeback_issue:info"
PRICE = "card:gpu_fence_chargeback_price:per_hour"
# Not billed: the SM activity ratios of each namespace's containers (each capped at 1), summed per evaluation.
GROUP_ACTIVE = "namespace:gpu_fence_chargeback_sm_active:ratio"

# The second level: every hour, the sums of the hour's evaluations of the series a bill reads (``hourly_rules``).
HOUR = 3600.0
HOURLY_EVALUATIONS = "gpu_fence:chargeback_hourly_evaluations:count"
# A series the first level records, the function that sums an hour of it, and the name of the hourly sum.
HOURLY = {
    CARD: ("count_over_time", "card:gpu_fence_chargeback_card:count1h"),
    GROUP_BOOKED: ("sum_over_time", "gpu_namespace:gpu_fence_chargeback_booked:card_ratio_sum1h"),
    GROUP_MEMORY: ("sum_over_time", "gpu_namespace:gpu_fence_chargeback_memory:bytes_sum1h"),
    GROUP_REQUESTED: ("sum_over_time", "gpu_namespace:gpu_fence_chargeback_requested:card_ratio_sum1h"),
    BOOKED: ("sum_over_time", "gpu_container:gpu_fence_chargeback_booked:card_ratio_sum1h"),
    MEMORY: ("sum_over_time", "gpu_container:gpu_fence_chargeback_memory:bytes_sum1h"),
    UNATTRIBUTED: ("sum_over_time", "gpu:gpu_fence_chargeback_unattributed:card_ratio_sum1h"),
    UNATTRIBUTED_MEMORY: ("sum_over_time", "gpu:gpu_fence_chargeback_unattributed_memory:bytes_sum1h"),
    IDLE: ("sum_over_time", "gpu:gpu_fence_chargeback_idle:card_ratio_sum1h"),
    ISSUE: ("max_over_time", "gpu:gpu_fence_chargeback_issue:info_max1h"),
    GROUP_ACTIVE: ("sum_over_time", "namespace:gpu_fence_chargeback_sm_active:ratio_sum1h"),
}
# Per container, a bill reads only the overreach rows (the rest it reads from the rollups per namespace).
HOURLY_MATCHERS = {BOOKED: f'charge="{Charge.OVERREACH.value}"', MEMORY: f'charge="{Charge.OVERREACH.value}"'}
# For a long range's timeline, the hours summed per node: a query's cost grows with the series it reads at each of
# its points, and a node's devices make one series here (the timeline selects cards by node, or by card where one
# node's cards have different prices: then it reads the per-device sums).
PER_NODE = {
    GROUP_BOOKED: "node_namespace:gpu_fence_chargeback_booked:card_ratio_sum1h",
    UNATTRIBUTED: "node:gpu_fence_chargeback_unattributed:card_ratio_sum1h",
    IDLE: "node:gpu_fence_chargeback_idle:card_ratio_sum1h",
}
# The pod labels the gpu_namespace rollups carry by default (the auditor's --pod-label KEY; label_<KEY> here).
DEFAULT_POD_LABELS = ("team",)


class Issue:
    """The ``issue`` label of ``ISSUE``: what ``ledger`` would have written a note about, per device."""

    UNKNOWN_DEVICE = "unknown-device"  # memory or allocations on a device without gpu_fence_gpu_info
    OUTSIDE_SLICES = "memory-outside-slices"  # memory on a MIG-partitioned card's own UUID
    OFFERED_MISSING = "offered-missing"  # held with no memory, no gpu_fence_gpu_offered_replicas (holder)
    OVER_HELD = "over-held"  # more ids held than offered (holder)
    SHARE_MISSING = "share-missing"  # a MIG device without gpu_fence_gpu_share_ratio


# A series finite and above zero, as ledger.py takes samples (``x > 0 < +Inf`` drops NaN, 0, negatives, +Inf).
_POSITIVE = "> 0 < +Inf"
_MIG_SUFFIX_RE2 = r"\s+MIG\s+\S+"  # prices._MIG_SUFFIX, as an RE2 fragment (a test keeps the two in step)


def _relabel(expression: str, target: str, source: str) -> str:
    """``expression`` with label ``target`` set to the value of ``source``."""
    return f'label_replace({expression}, "{target}", "$1", "{source}", "(.*)")'


def _set(expression: str, label: str, value: str) -> str:
    return f'label_replace({expression}, "{label}", {string(value)}, "", "")'


def string(text: str) -> str:
    """A PromQL string literal (Go's escapes for backslash, quote and control characters)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


# The auditor's device series: MIG slices (a parent card named), and whole GPUs.
_SLICES = f'{metric_names.GPU_INFO}{{parent_uuid!=""}}'
_WHOLE = f'{metric_names.GPU_INFO}{{parent_uuid=""}}'


@dataclass(frozen=True)
class _Parts:
    """The shared sub-expressions of the split, each written once. Labels are noted as (node, gpu_uuid, ...)."""

    # Devices. A MIG slice is a unit worth its share ratio; a whole GPU is a unit worth 1 unless slices of it are.
    @property
    def share(self) -> str:  # (node, gpu_uuid): a usable share ratio
        return f"(max by (node, gpu_uuid) ({metric_names.GPU_SHARE}) >= 0 < +Inf)"

    @property
    def slices(self) -> str:  # (node, gpu_uuid, card_uuid) = 1: every MIG device the auditor lists
        slices = _relabel(_SLICES, "card_uuid", "parent_uuid")
        return f"group by (node, gpu_uuid, card_uuid) ({slices})"

    @property
    def slice_units(self) -> str:  # (node, gpu_uuid, card_uuid) = share: MIG devices with a share ratio
        return f"({self.slices} * on (node, gpu_uuid) group_left () {self.share})"

    @property
    def whole(self) -> str:  # (node, gpu_uuid, card_uuid = gpu_uuid) = 1: every whole GPU
        return _relabel(f"group by (node, gpu_uuid) ({_WHOLE})", "card_uuid", "gpu_uuid")

    @property
    def units(self) -> str:  # (node, gpu_uuid, card_uuid) = the unit's share of its card
        return f"(({self.whole} unless on (node, card_uuid) {self.slice_units}) or {self.slice_units})"

    @property
    def unit_ids(self) -> str:  # (node, gpu_uuid, card_uuid) = 1
        return f"group by (node, gpu_uuid, card_uuid) ({self.units})"

    @property
    def devices(self) -> str:  # (node, gpu_uuid, card_uuid) = what one allocation id is worth in a request
        return f"({self.slice_units} or {self.whole})"

    @property
    def uncovered(self) -> str:  # (node, gpu_uuid = card_uuid, card_uuid): MIG capacity in no slice
        free = f"clamp_min(1 - sum by (node, card_uuid) ({self.slice_units}), 0)"
        return f"({_relabel(free, 'gpu_uuid', 'card_uuid')} > {ROUNDING!r})"

    @property
    def cards(self) -> str:  # (node, card_uuid, model) = 1: the cards present and the model each is priced by
        own = _relabel(f"group by (node, gpu_uuid, model) ({_WHOLE})", "card_uuid", "gpu_uuid")
        own = f"group by (node, card_uuid, model) ({own})"
        of_slices = _relabel(_SLICES, "card_uuid", "parent_uuid")
        of_slices = f'label_replace({of_slices}, "model", "$1", "model", {string("(.*?)" + _MIG_SUFFIX_RE2)})'
        of_slices = f"group by (node, card_uuid, model) ({of_slices})"
        present = f"group by (node, card_uuid) ({self.units})"
        return f"(({own} or on (node, card_uuid) {of_slices}) and on (node, card_uuid) {present})"

    # Who is on a unit. The auditor's series are first deduplicated with max by its own labels, as raw.py's
    # queries do; series scraped without honor_labels (exported_namespace) are left out (chargeback refuses them).
    @property
    def memory(self) -> str:  # (node, namespace, pod, container, gpu_uuid, allocated) = bytes
        return (
            "(max by (node, namespace, pod, container, gpu_uuid, allocated) "
            f'({metric_names.CONTAINER_MEMORY}{{exported_namespace=""}}) {_POSITIVE})'
        )

    @property
    def charged_memory(self) -> str:  # (node, namespace, pod, container, gpu_uuid, charge) = bytes
        usage = _set(self.memory, "charge", Charge.USAGE.value)
        charged = f'label_replace({usage}, "charge", "{Charge.OVERREACH.value}", "allocated", "false")'
        return f"sum without (allocated) ({charged})"

    @property
    def unattributed(self) -> str:  # (node, gpu_uuid) = bytes
        return f"(max by (node, gpu_uuid) ({metric_names.UNATTRIBUTED_MEMORY}) {_POSITIVE})"

    @property
    def in_use(self) -> str:  # (node, gpu_uuid) = every byte on the device
        return f"sum by (node, gpu_uuid) ({self.memory} or {self.unattributed})"

    @property
    def allocated(self) -> str:  # (node, namespace, pod, container, gpu_uuid) = allocation ids held
        return (
            "(max by (node, namespace, pod, container, gpu_uuid) "
            f'({metric_names.CONTAINER_ALLOCATED}{{exported_namespace=""}}) {_POSITIVE})'
        )

    @property
    def held(self) -> str:  # (node, gpu_uuid) = ids held by anyone
        return f"sum by (node, gpu_uuid) ({self.allocated})"

    @property
    def idle_holders(self) -> str:  # holders with none of their memory on the device
        return f"({self.allocated} unless on (node, gpu_uuid, namespace, pod, container) {self.memory})"

    @property
    def offered(self) -> str:  # (node, gpu_uuid) = replicas the device plugin offers
        return f"(max by (node, gpu_uuid) ({metric_names.GPU_OFFERED_REPLICAS}) {_POSITIVE})"

    @property
    def replicas(self) -> str:
        """What a held id is a share of: the replicas offered, or all ids held when that is unknown or fewer."""
        return f"((({self.offered} or {self.held}) >= {self.held}) or {self.held})"

    @property
    def reserved(self) -> str:  # (node, namespace, pod, container, gpu_uuid, card_uuid) = ids / replicas × unit
        return (
            f"({self.idle_holders} * on (node, gpu_uuid) group_left (card_uuid) {self.units}"
            f" / on (node, gpu_uuid) group_left () {self.replicas})"
        )

    def rest(self, method: Method) -> str:  # (node, gpu_uuid, card_uuid) = what memory splits
        if method is Method.USAGE:
            return self.units
        reserved = f"sum by (node, gpu_uuid) ({self.reserved})"
        return f"(clamp_min({self.units} - on (node, gpu_uuid) group_left () {reserved}, 0) or {self.units})"

    def by_bytes(self, users: str, method: Method) -> str:
        """``users`` (bytes on a device) × what memory splits ÷ the bytes in use there."""
        return (
            f"({users} * on (node, gpu_uuid) group_left (card_uuid) {self.rest(method)}"
            f" / on (node, gpu_uuid) group_left () {self.in_use})"
        )


P = _Parts()


def _labelled(expression: str, names: Sequence[str]) -> str:
    """``expression`` (per container: namespace, pod, ...) with its pod's ``names`` labels at this instant, from
    ``gpu_fence_pod_labels``. A pod the auditor exported no labels for keeps its series, without them (chargeback
    bills it to ``(none)``); one exported twice at once (a label that just changed) takes one of the two."""
    if not names:
        return expression
    labels = ", ".join(names)
    one_each = f"topk by (namespace, pod) (1, group by (namespace, pod, {labels}) ({metric_names.POD_LABELS}))"
    pods = f"group by (namespace, pod) ({metric_names.CONTAINER_MEMORY} or {metric_names.CONTAINER_ALLOCATED})"
    return f"({expression} * on (namespace, pod) group_left ({labels}) ({one_each} or on (namespace, pod) {pods}))"


def _by(names: Sequence[str], *labels: str) -> str:
    return ", ".join([*labels, *names])


DEVICE = ("node", "gpu_uuid", "card_uuid")


def _booked(expression: str, names: Sequence[str], labels: dict[str, str]) -> list[dict[str, Any]]:
    """One share of the split, per container and summed per device and namespace (the rollup a bill reads)."""
    per_container = _labelled(expression, names)
    rollup = f"sum by ({_by(names, *DEVICE, 'namespace', 'charge')}) ({per_container})"
    return [
        {"record": BOOKED, "expr": per_container, "labels": labels},
        {"record": GROUP_BOOKED, "expr": rollup, "labels": labels},
    ]


def split_rules(method: Method, names: Sequence[str]) -> list[dict[str, Any]]:
    """The rules that depend on the method: who pays which share of each unit, and what is left idle."""
    labels = {"method": method.value}
    rules = _booked(P.by_bytes(P.charged_memory, method), names, labels)
    if method is Method.HOLDER:
        rules += _booked(P.reserved, names, {**labels, "charge": Charge.RESERVED.value})
    idle = f"(({P.rest(method)} unless on (node, gpu_uuid) {P.in_use}) > 0) or {P.uncovered}"
    rules += [
        {"record": UNATTRIBUTED, "expr": P.by_bytes(P.unattributed, method), "labels": labels},
        {"record": IDLE, "expr": idle, "labels": labels},
    ]
    return rules


def issue_rules() -> list[dict[str, Any]]:
    holders_on_units = f"({P.idle_holders} and on (node, gpu_uuid) {P.units})"
    sliced_cards = f"({P.whole} and on (node, card_uuid) {P.slice_units})"
    exprs = {
        Issue.UNKNOWN_DEVICE: (
            f"group by (node, gpu_uuid) ({P.memory} or {P.unattributed} or {P.allocated})"
            f" unless on (node, gpu_uuid) {P.devices}"
        ),
        Issue.OUTSIDE_SLICES: (
            f"group by (node, gpu_uuid) ({P.memory} or {P.unattributed}) and on (node, gpu_uuid) {sliced_cards}"
        ),
        Issue.OFFERED_MISSING: f"group by (node, gpu_uuid) ({holders_on_units}) unless on (node, gpu_uuid) {P.offered}",
        Issue.OVER_HELD: (
            f"group by (node, gpu_uuid) (({P.held} > on (node, gpu_uuid) {P.offered})"
            f" and on (node, gpu_uuid) {holders_on_units})"
        ),
        Issue.SHARE_MISSING: f"group by (node, gpu_uuid) ({P.slices} unless on (node, gpu_uuid) {P.share})",
    }
    return [{"record": ISSUE, "expr": expr, "labels": {"issue": issue}} for issue, expr in exprs.items()]


def recording_rules(
    interval: float = DEFAULT_INTERVAL, pod_labels: Sequence[str] = DEFAULT_POD_LABELS
) -> dict[str, Any]:
    """The rule group (a mapping, as a rules file holds it) evaluating the split every ``interval`` seconds; the
    rollups per device and namespace also carry the pod labels ``pod_labels`` (keys as the auditor's --pod-label)."""
    names = [label_name(key) for key in pod_labels]
    memory = _labelled(f"({P.charged_memory} * on (node, gpu_uuid) group_left (card_uuid) {P.unit_ids})", names)
    requested = _labelled(f"({P.allocated} * on (node, gpu_uuid) group_left (card_uuid) {P.devices})", names)
    unattributed_memory = f"({P.unattributed} * on (node, gpu_uuid) group_left (card_uuid) {P.unit_ids})"
    sm = f"max by (node, namespace, pod, container, gpu_uuid) ({metric_names.CONTAINER_SM_ACTIVITY})"
    active = _labelled(f"clamp_max({sm}, 1)", names)
    rules: list[dict[str, Any]] = [
        {"record": INTERVAL, "expr": f"vector({_seconds(interval)})"},
        {"record": CARD, "expr": P.cards},
        *split_rules(Method.HOLDER, names),
        *split_rules(Method.USAGE, names),
        {"record": MEMORY, "expr": memory},
        {"record": GROUP_MEMORY, "expr": f"sum by ({_by(names, *DEVICE, 'namespace', 'charge')}) ({memory})"},
        {"record": UNATTRIBUTED_MEMORY, "expr": unattributed_memory},
        {"record": REQUESTED, "expr": requested},
        {"record": GROUP_REQUESTED, "expr": f"sum by ({_by(names, *DEVICE, 'namespace')}) ({requested})"},
        {"record": GROUP_ACTIVE, "expr": f"sum by ({_by(names, 'namespace')}) ({active})"},
        *issue_rules(),
    ]
    return {"name": GROUP, "interval": duration(interval), "rules": rules}


def hourly_evaluations(interval: float) -> int:
    """How many evaluations of the split group an hour holds; 0 when its interval does not divide an hour (no
    hourly group then: a bill sums the interval's series, as without it)."""
    count = round(HOUR / interval)
    return count if count >= 2 and abs(count * interval - HOUR) < 1e-6 else 0


def hourly_rules(interval: float = DEFAULT_INTERVAL) -> dict[str, Any] | None:
    """The second level: every hour, each series a bill reads summed over the split group's evaluations of one
    hour, so that a month's bill reads 12 times fewer samples (at 5 minutes) and the same sums.

    These rules read the split group's output, the one place a chargeback rule reads another's. So that an hour is
    summed only once all of it is recorded, each reads the hour that ended one ``interval`` before its own
    evaluation (``offset``: the split group's evaluation at the hour's end has been written by then) and records
    only when that hour holds every evaluation (``HOURLY_EVALUATIONS``); a bill sums the interval's series where
    an hour is missing. An hourly sample at T stands for the evaluations in ``(T - interval - 1h, T - interval]``.
    Ranges are a millisecond short of the hour, as everywhere here, so that one evaluation is never in two hours.
    """
    count = hourly_evaluations(interval)
    if not count:
        return None
    window = f"[{round(HOUR * 1000) - 1}ms] offset {duration(interval)}"
    complete = f"count_over_time({INTERVAL}{window}) == {count}"
    rules: list[dict[str, Any]] = [{"record": HOURLY_EVALUATIONS, "expr": complete}]
    for source, (function, name) in HOURLY.items():
        matchers = HOURLY_MATCHERS.get(source, "")
        selector = f"{source}{{{matchers}}}" if matchers else source
        rules.append({"record": name, "expr": f"{function}({selector}{window}) and on () ({complete})"})
    for source, name in PER_NODE.items():
        summed = f"sum without (gpu_uuid, card_uuid) (sum_over_time({source}{window}))"
        rules.append({"record": name, "expr": f"{summed} and on () ({complete})"})
    return {"name": HOURLY_GROUP, "interval": "1h", "rules": rules}


# Prices as series, for dashboards: the price list's lookup (prices.Prices.match) in PromQL.


def glob_re2(pattern: str) -> str:
    """An fnmatch pattern as an RE2 regex that PromQL's ``=~`` (anchored) matches exactly as
    ``fnmatch.fnmatchcase`` does: ``*``, ``?``, ``[seq]``, ``[!seq]`` with ranges, an unclosed ``[`` taken
    literally, and empty ranges dropped, following CPython 3.11's ``fnmatch.translate`` step by step."""
    out: list[str] = []
    index, size = 0, len(pattern)
    while index < size:
        char = pattern[index]
        index += 1
        if char == "*":
            if not out or out[-1] != ".*":
                out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = index
            if end < size and pattern[end] == "!":
                end += 1
            if end < size and pattern[end] == "]":
                end += 1
            while end < size and pattern[end] != "]":
                end += 1
            if end >= size:
                out.append(r"\[")
                continue
            out.append(_glob_set(pattern, index, end))
            index = end + 1
        else:
            out.append(re.escape(char))
    return "(?s:" + "".join(out) + ")"


def _glob_set(pattern: str, start: int, end: int) -> str:
    """The bracket expression ``pattern[start:end]`` (after ``[``, before ``]``) as an RE2 character class."""
    stuff = pattern[start:end]
    if "-" not in stuff:
        stuff = stuff.replace("\\", r"\\")
    else:
        chunks: list[str] = []
        position = start + 2 if pattern[start] == "!" else start + 1
        while True:
            position = pattern.find("-", position, end)
            if position < 0:
                break
            chunks.append(pattern[start:position])
            start = position + 1
            position += 3
        chunk = pattern[start:end]
        if chunk:
            chunks.append(chunk)
        else:
            chunks[-1] += "-"
        for position in range(len(chunks) - 1, 0, -1):  # drop empty ranges such as z-a
            if chunks[position - 1][-1] > chunks[position][0]:
                chunks[position - 1] = chunks[position - 1][:-1] + chunks[position][1:]
                del chunks[position]
        stuff = "-".join(part.replace("\\", r"\\").replace("-", r"\-") for part in chunks)
    stuff = re.sub(r"([&~|\[\]])", r"\\\1", stuff)
    if not stuff:
        return r"[^\s\S]"  # an empty set matches nothing
    if stuff == "!":
        return "."  # a negated empty set matches any character
    if stuff[0] == "!":
        stuff = "^" + stuff[1:]
    elif stuff[0] == "^":
        stuff = "\\" + stuff
    return f"[{stuff}]"


def price_expr(prices: Prices, cards: Callable[[str], str]) -> str:
    """Each card at its price per hour, labelled (node, card_uuid, model): the first entry of the price list that
    matches, in the order ``Prices.match`` tries them, and nothing for a card none matches. ``cards(matchers)`` is
    the cards as series labelled node, card_uuid and model, narrowed by ``matchers`` (PromQL label matchers,
    possibly empty). Each term is 1 × its price over the cards it matches; ``or`` keeps the first term per card."""

    def priced(matchers: str, price: float) -> str:
        return f"(group by (node, card_uuid, model) ({cards(matchers)}) * {price!r})"

    terms = [priced(f"node={string(node)}", price) for node, price in prices.nodes]
    terms += [priced(f"node=~{string(glob_re2(node))}", price) for node, price in prices.nodes]
    model_of_card = f"({_MIG_SUFFIX_RE2})?"
    terms += [priced(f"model=~{string(re.escape(model) + model_of_card)}", price) for model, price in prices.models]
    if prices.default is not None:
        terms.append(priced("", prices.default))
    return "(" + " or ".join(terms) + ")"


def _whole_cards(matchers: str) -> str:
    """Whole GPUs as cards (node, card_uuid, model), from the auditor's own series."""
    selector = f'{metric_names.GPU_INFO}{{parent_uuid=""{", " + matchers if matchers else ""}}}'
    return _relabel(selector, "card_uuid", "gpu_uuid")


def price_rules(prices: Prices, interval: float = DEFAULT_INTERVAL) -> dict[str, Any]:
    """A rule group recording every card's price per hour from a price list, for dashboards. The bill does not
    read it: it prices the card-hours it sums with the price list it is given, so a new price list re-prices any
    past month without re-recording anything."""
    return {
        "name": PRICE_GROUP,
        "interval": duration(interval),
        "rules": [{"record": PRICE, "expr": price_expr(prices, _whole_cards), "labels": {"currency": prices.currency}}],
    }


def rules_file(
    interval: float = DEFAULT_INTERVAL, prices: Prices | None = None, pod_labels: Sequence[str] = DEFAULT_POD_LABELS
) -> str:
    """A Prometheus rules file: the split's group, its hourly sums (when the interval divides an hour), and with
    ``prices`` the price group."""
    groups = [recording_rules(interval, pod_labels)]
    hourly = hourly_rules(interval)
    if hourly is not None:
        groups.append(hourly)
    if prices is not None:
        groups.append(price_rules(prices, interval))
    body = yaml.safe_dump({"groups": groups}, sort_keys=False, width=118)
    return HEADER + body


HEADER = """\
# gpu-fence chargeback: the per-interval split as recording rules (docs/chargeback.md, "Recorded series").
# Generated by `gpu-fence-auditor chargeback --rules`; do not edit by hand, regenerate (--step sets the interval).
"""


def duration(seconds: float) -> str:
    """Seconds as a Prometheus duration (``5m``, ``90s``, ``1500ms``)."""
    milliseconds = round(seconds * 1000)
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if milliseconds % size == 0:
            return f"{milliseconds // size}{unit}"
    return f"{milliseconds}ms"


def _seconds(seconds: float) -> str:
    return f"{seconds:g}" if seconds == int(seconds) else f"{seconds!r}"
