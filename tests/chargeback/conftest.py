"""Shared fixtures: one real Prometheus holding every hand-checked scenario (``tests.fakes.chargeback_scenarios``)
and what the chargeback recording rules recorded over them: the split every 10 minutes, then its hourly sums, and
each card's price."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_fence.chargeback.prices import prices_from_mapping
from gpu_fence.chargeback.rules import rules_file
from tests.fakes.chargeback_scenarios import PRICES_YAML, RECORDED_RANGES, RULES_INTERVAL, scenarios
from tests.fakes.prometheus import PrometheusServer


def rule_groups(rules_yaml: str) -> list[str]:
    """A rules file as one file per group: promtool backfills one level of rules at a time (the hourly sums read
    what the split group recorded, which must be in the server first: Prometheus' docs/storage.md, "Backfilling for
    Recording Rules", Limitations)."""
    groups = yaml.safe_load(rules_yaml)["groups"]
    return [yaml.safe_dump({"groups": [group]}, sort_keys=False) for group in groups]


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory):
    with PrometheusServer(tmp_path_factory.mktemp("prometheus"), openmetrics=scenarios()) as server:
        prices = prices_from_mapping(yaml.safe_load(PRICES_YAML))  # the price group too, for the cost dashboard
        for level in rule_groups(rules_file(RULES_INTERVAL, prices, pod_labels=["example.com/team"])):
            server.record(level, RECORDED_RANGES)
        yield server


@pytest.fixture
def prices_file(tmp_path: Path) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(PRICES_YAML, encoding="utf-8")
    return path
