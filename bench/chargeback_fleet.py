"""A synthetic GPU fleet for the chargeback benchmark: the auditor's series over days, as OpenMetrics per TSDB block.

The fleet is H100 nodes of 8 GPUs. Every 16th node offers its GPUs as 4 time-slicing replicas, and the node 8 after
it splits each GPU into MIG slices 3g + 2g + 2g (3/7, 2/7, 2/7 of the card); the rest are exclusive. Each *slot* (an
exclusive GPU, a replica, a slice) runs pods one after another: a gap of 0 to 90 minutes, then a pod living 30
minutes to 6 hours, so that 2,048 GPUs run about 16,000 pods a day (the issue's fleet) and 500,000 in 30 days.
A pod holds its slot all its life (``gpu_fence_container_allocated_gpus``) and, nine pods in ten, puts memory on
it from a few minutes after its start until its end; one in ten holds it idle. One pod in 200 also puts memory on
another GPU of its node without an allocation (overreach), and one GPU in 100 carries a host process's memory for
a few hours (unattributed). Pods are spread over 20 namespaces, each with a ``team`` pod label (8 teams).

The series are those the auditor exports (``auditor/metrics.py``), sampled every ``resolution`` seconds on a grid
that starts ``lead`` before the range; samples of one series form runs of a constant value, written out one TSDB
block (2 hours) at a time, because ``promtool tsdb create-blocks-from openmetrics`` re-reads its whole input once
per block it writes.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

GIB = 1 << 30
BLOCK = 7200  # seconds: Prometheus' TSDB block
LOOKBACK = 300.0  # Prometheus' default lookback: a sample is seen at T when T - 5m <= its time <= T (Prometheus 2)
H100 = "NVIDIA H100 80GB HBM3"
NAMESPACES = 20
TEAMS = 8
REPLICAS = 4
MIG_SLICES = ((3, "3g.40gb"), (2, "2g.20gb"), (2, "2g.20gb"))
PRICE = 4.0  # per H100 and hour
PRICES_YAML = f'currency: USD\nmodels:\n  "{H100}": {PRICE}\n'

Labels = tuple[tuple[str, str], ...]
Key = tuple[str, Labels]  # (metric, labels)


@dataclass
class Run:
    start: float  # the first sample is the first grid instant at or after this
    end: float  # the last sample is the last grid instant at or before this
    value: float


@dataclass
class Grid:
    """Where samples fall: every ``step`` seconds from ``origin`` up to ``end``."""

    origin: float
    step: float
    end: float

    def first(self, moment: float) -> float:
        steps = -(-(moment - self.origin) // self.step)
        return self.origin + max(0.0, steps) * self.step

    def last(self, moment: float) -> float:
        return self.origin + ((min(moment, self.end) - self.origin) // self.step) * self.step

    def samples(self, run: Run) -> tuple[float, float] | None:
        """The first and last sample of ``run``, or None when it has none."""
        first, last = self.first(run.start), self.last(run.end)
        return (first, last) if last >= first else None


@dataclass
class Series:
    """Series as runs of a constant value, and where each comes from (its node, its pod); sampled on ``grid`` when
    they have their own (the hourly sums), else on the fleet's."""

    runs: dict[Key, list[Run]] = field(default_factory=lambda: defaultdict(list))
    grid: Grid | None = None

    def add(self, metric: str, labels: dict[str, str], run: Run) -> Key:
        key = (metric, tuple(labels.items()))
        self.runs[key].append(run)
        return key

    def count(self) -> int:
        return len(self.runs)

    def samples(self, grid: Grid) -> int:
        total = 0
        for runs in self.runs.values():
            for run in runs:
                span = grid.samples(run)
                if span is not None:
                    total += round((span[1] - span[0]) / grid.step) + 1
        return total

    def block_text(self, grid: Grid, low: float, high: float) -> str:
        """Samples with ``low <= t < high``, each metric under its TYPE line, ending with ``# EOF``; "" if none."""
        families: dict[str, list[str]] = defaultdict(list)
        for (metric, labels), runs in self.runs.items():
            head = metric + "{" + ",".join(f'{name}="{value}"' for name, value in labels) + "} "
            lines = families[metric]
            for run in runs:
                span = grid.samples(run)
                if span is None:
                    continue
                first, last = max(span[0], grid.first(low)), min(span[1], grid.last(high - 1e-6))
                if last < first:
                    continue
                prefix = f"{head}{run.value!r} "
                count = round((last - first) / grid.step) + 1
                lines.extend(f"{prefix}{first + index * grid.step:.3f}" for index in range(count))
        out: list[str] = []
        for metric, lines in families.items():
            if lines:
                out += [f"# TYPE {metric} gauge", *lines]
        return "\n".join([*out, "# EOF", ""]) if out else ""


@dataclass(frozen=True)
class Rates:
    """How often the uncommon cases happen: per pod, memory in use and overreach; per GPU, a host process."""

    memory: float = 0.9
    overreach: float = 0.005
    host_process: float = 0.01


@dataclass
class Fleet:
    """Every series of the fleet over [start - lead, end]."""

    gpus: int
    start: float
    end: float
    resolution: float
    rates: Rates = field(default_factory=Rates)
    lead: float = 3600.0  # series start this long before the range, so that its first instants have data
    series: Series = field(default_factory=Series)
    # The series that decide each card's split: its own and its slices', and those of the pods on it (their
    # memory, allocations and labels). A card's split depends on nothing else.
    by_card: dict[str, list[Key]] = field(default_factory=lambda: defaultdict(list))
    pods: int = 0

    @property
    def grid(self) -> Grid:
        return Grid(self.start - self.lead, self.resolution, self.end)

    def add(self, metric: str, labels: dict[str, str], run: Run, *cards: str) -> None:
        key = self.series.add(metric, labels, run)
        if len(self.series.runs[key]) == 1:
            for card in cards:
                self.by_card[card].append(key)

    def blocks(self, *others: Series, raw: bool = True, size: int = BLOCK) -> Iterator[tuple[int, str]]:
        """(block start, OpenMetrics of the fleet's samples and ``others``' in that block) for every block of
        ``size`` seconds; ``raw`` false leaves the fleet's own series out."""
        grid = self.grid
        first = int(grid.origin) // size * size
        every = (self.series, *others) if raw else others
        for block in range(first, int(self.end) + 1, size):
            texts = [text for text in (s.block_text(s.grid or grid, block, block + size) for s in every) if text]
            if texts:
                yield block, "".join(text.removesuffix("# EOF\n") for text in texts) + "# EOF\n"


def _uuid(rng: random.Random, prefix: str) -> str:
    return f"{prefix}-{uuid.UUID(int=rng.getrandbits(128))}"


@dataclass(frozen=True)
class Slot:
    """Where a pod runs: an exclusive GPU, a replica of one or a MIG slice of ``card``, worth ``share`` of it."""

    node: str
    device: str
    card: str
    share: float
    cards: tuple[str, ...]  # the node's cards, one of which an overreaching pod also uses


def build(  # noqa: PLR0917
    gpus: int, start: float, end: float, resolution: float, seed: int = 16, rates: Rates | None = None
) -> Fleet:
    """The fleet of ``gpus`` GPUs (a multiple of 8) over [start, end], sampled every ``resolution`` seconds."""
    if gpus <= 0 or gpus % 8:
        raise ValueError(f"gpus must be a positive multiple of 8, got {gpus}")
    rng = random.Random(seed)
    fleet = Fleet(gpus=gpus, start=start, end=end, resolution=resolution, rates=rates or Rates())
    first = start - fleet.lead
    counter = 0
    for index in range(gpus // 8):
        node = f"gpu-node-{index:04d}"
        kind = "timeslice" if index % 16 == 0 else "mig" if index % 16 == 8 else "exclusive"
        cards = tuple(_uuid(rng, "GPU") for _ in range(8))
        slots: list[Slot] = []
        for card in cards:
            slots += _card(fleet, rng, Slot(node, card, card, 1.0, cards), kind)
        for slot in slots:
            moment = first - rng.uniform(0, 6 * 3600)
            while True:
                moment += rng.uniform(0, 1.5 * 3600)
                life = rng.uniform(0.5 * 3600, 6 * 3600)
                if moment > end:
                    break
                counter += 1
                if moment + life >= first:
                    _pod(fleet, rng, slot, number=counter, born=moment, dies=moment + life)
                moment += life
    return fleet


def _card(fleet: Fleet, rng: random.Random, whole: Slot, kind: str) -> list[Slot]:
    """One card's own series (and its slices'), and the slots its pods run in."""
    node, card, first, end = whole.node, whole.card, fleet.start - fleet.lead, fleet.end
    _device(fleet, Slot(node, card, card, 1.0, whole.cards), parent="", model=H100, profile="")
    if rng.random() < fleet.rates.host_process:  # a host process on this GPU for a few hours
        begin = rng.uniform(first, end)
        stop = begin + rng.uniform(1, 6) * 3600
        runs = [Run(first, begin - 0.001, 0), Run(begin, stop, GIB), Run(stop + 0.001, end, 0)]
    else:
        runs = [Run(first, end, 0)]
    for run in runs:
        fleet.add("gpu_fence_unattributed_gpu_memory_bytes", {"node": node, "gpu_uuid": card}, run, card)
    if kind != "mig":
        replicas = REPLICAS if kind == "timeslice" else 1
        fleet.add("gpu_fence_gpu_offered_replicas", {"node": node, "gpu_uuid": card}, Run(first, end, replicas), card)
        return [whole] * replicas
    slots = []
    for size, profile in MIG_SLICES:
        slot = Slot(node, _uuid(rng, "MIG"), card, size / 7, whole.cards)
        _device(fleet, slot, parent=card, model=f"{H100} MIG {profile}", profile=profile)
        where = {"node": node, "gpu_uuid": slot.device}
        fleet.add("gpu_fence_gpu_offered_replicas", where, Run(first, end, 1), card)
        fleet.add("gpu_fence_unattributed_gpu_memory_bytes", where, Run(first, end, 0), card)
        slots.append(slot)
    return slots


def _device(fleet: Fleet, slot: Slot, *, parent: str, model: str, profile: str) -> None:
    first = fleet.start - fleet.lead
    info = {"node": slot.node, "gpu_uuid": slot.device, "parent_uuid": parent, "model": model, "mig_profile": profile}
    fleet.add("gpu_fence_gpu_info", info, Run(first, fleet.end, 1), slot.card)
    share = {"node": slot.node, "gpu_uuid": slot.device}
    fleet.add("gpu_fence_gpu_share_ratio", share, Run(first, fleet.end, slot.share), slot.card)


def _pod(fleet: Fleet, rng: random.Random, slot: Slot, *, number: int, born: float, dies: float) -> None:
    fleet.pods += 1
    namespace = f"team-{number * 7 % NAMESPACES:02d}"
    pod = f"job-{number:07d}-{rng.getrandbits(20):05x}"
    who = {"node": slot.node, "namespace": namespace, "pod": pod, "container": "main"}
    fleet.add("gpu_fence_container_allocated_gpus", {**who, "gpu_uuid": slot.device}, Run(born, dies, 1), slot.card)
    if rng.random() < fleet.rates.memory:
        gib = rng.uniform(2, 75) * slot.share
        fleet.add(
            "gpu_fence_container_gpu_memory_bytes",
            {**who, "gpu_uuid": slot.device, "allocated": "true"},
            Run(born + rng.uniform(0, 600), dies, float(round(gib * GIB))),
            slot.card,
        )
    cards = [slot.card]
    other = rng.choice(slot.cards)
    if rng.random() < fleet.rates.overreach and other != slot.card:  # on another card of the node, unallocated
        cards.append(other)
        fleet.add(
            "gpu_fence_container_gpu_memory_bytes",
            {**who, "gpu_uuid": other, "allocated": "false"},
            Run(born, min(dies, born + 3600), float(GIB)),
            other,
        )
    team = f"cc-{int(namespace[-2:]) % TEAMS}"
    labels = {"namespace": namespace, "pod": pod, "label_team": team}
    fleet.add("gpu_fence_pod_labels", labels, Run(born, dies, 1), *cards)
