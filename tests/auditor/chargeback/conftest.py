"""Shared fixtures: one real Prometheus holding every hand-checked scenario (``tests.fakes.chargeback_scenarios``)
and what the chargeback recording rules recorded over them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_fence.auditor.chargeback.rules import rules_file
from tests.fakes.chargeback_scenarios import PRICES_YAML, RECORDED_RANGES, RULES_INTERVAL, scenarios
from tests.fakes.prometheus import PrometheusServer


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory):
    with PrometheusServer(tmp_path_factory.mktemp("prometheus"), openmetrics=scenarios()) as server:
        server.record(rules_file(RULES_INTERVAL, pod_labels=["example.com/team"]), RECORDED_RANGES)
        yield server


@pytest.fixture
def prices_file(tmp_path: Path) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(PRICES_YAML, encoding="utf-8")
    return path
