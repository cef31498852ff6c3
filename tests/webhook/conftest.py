"""Fixtures for the webhook tests. Builders and strategies live in ``pods.py`` (``from pods import ...``)."""

from __future__ import annotations

import pytest

from gpu_fence.webhook.config import PolicyConfig


@pytest.fixture
def config() -> PolicyConfig:
    """The defaults: what a stock install runs with."""
    return PolicyConfig()
