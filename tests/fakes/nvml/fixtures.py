"""pytest fixtures for the fake NVML: the library built once per session, and opening it with a config.

A test module asks for them with ``pytest_plugins = ["tests.fakes.nvml.fixtures"]``, and imports ``OpenNvml``, the
type of ``open_nvml``, from here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpu_fence.auditor.nvml import Nvml
from tests.fakes.nvml import CONFIG_ENV, FakeNvmlConfig, build_fake_nvml

OpenNvml = Callable[[FakeNvmlConfig], Nvml]


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.getbasetemp() / "fake-nvml")


@pytest.fixture
def open_nvml(fake_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenNvml]:
    """``open_nvml(config)``: write the config, point the fake at it, return an open Nvml (closed after the test)."""
    opened: list[Nvml] = []

    def open_with(config: FakeNvmlConfig) -> Nvml:
        path = config.write(tmp_path / f"nvml-{len(opened)}.conf")
        monkeypatch.setenv(CONFIG_ENV, str(path))
        nvml = Nvml(str(fake_lib))
        nvml.open()
        opened.append(nvml)
        return nvml

    yield open_with
    for nvml in opened:
        nvml.close()
