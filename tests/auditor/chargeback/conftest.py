"""Shared fixtures: one real Prometheus holding every hand-checked scenario (``tests.fakes.chargeback_scenarios``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.chargeback_scenarios import PRICES_YAML, scenarios
from tests.fakes.prometheus import PrometheusServer


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory):
    with PrometheusServer(tmp_path_factory.mktemp("prometheus"), openmetrics=scenarios()) as server:
        yield server


@pytest.fixture
def prices_file(tmp_path: Path) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(PRICES_YAML, encoding="utf-8")
    return path
