"""scripts/typecheck: mypy run for real over a small project of its own, held to its clean list and baseline."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fakes.processes import run_captured

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "typecheck"

PYPROJECT = """\
[tool.mypy]
files = ["core", "rest"]
strict = true
"""
CLEAN_MODULE = "def double(value: int) -> int:\n    return value * 2\n"
SLOPPY_MODULE = "def double(value):\n    return value * 2\n"  # no annotation: one error under strict


def project(tmp_path: Path, *, core: str = CLEAN_MODULE, rest: str = SLOPPY_MODULE) -> Path:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "pyproject.toml").write_text(PYPROJECT, encoding="utf-8")
    (tmp_path / "scripts" / "typecheck-clean.txt").write_text("# strict-clean\ncore/\n", encoding="utf-8")
    for package, text in (("core", core), ("rest", rest)):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("", encoding="utf-8")
        (tmp_path / package / "module.py").write_text(text, encoding="utf-8")
    return tmp_path


def typecheck(root: Path, *args: str):
    return run_captured([sys.executable, str(SCRIPT), "--root", str(root), *args], timeout=600)


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    root = project(tmp_path)
    result = typecheck(root, "--update")
    assert result.returncode == 0, result.stderr
    baseline = (root / "scripts" / "typecheck-baseline.txt").read_text(encoding="utf-8")
    assert "rest/module.py: [no-untyped-def] Function is missing a type annotation" in baseline
    return root


def test_errors_in_the_baseline_pass(recorded: Path) -> None:
    result = typecheck(recorded)
    assert result.returncode == 0, result.stderr
    assert "1 errors, all in the baseline; none in the 1 strict paths of scripts/typecheck-clean.txt" in result.stdout


def test_a_new_error_fails_and_is_named(recorded: Path) -> None:
    (recorded / "rest" / "other.py").write_text("def half(value):\n    return value / 2\n", encoding="utf-8")
    result = typecheck(recorded)
    assert result.returncode == 1
    assert "new type errors" in result.stderr and "rest/other.py" in result.stderr


def test_an_error_in_a_clean_module_fails_even_if_recorded(recorded: Path) -> None:
    baseline = recorded / "scripts" / "typecheck-baseline.txt"
    baseline.write_text(
        baseline.read_text(encoding="utf-8")
        + "core/module.py: [no-untyped-def] Function is missing a type annotation\n",
        encoding="utf-8",
    )
    (recorded / "core" / "module.py").write_text(SLOPPY_MODULE, encoding="utf-8")
    result = typecheck(recorded)
    assert result.returncode == 1
    assert "must be free of type errors" in result.stderr and "core/module.py:1: error" in result.stderr


def test_the_baseline_may_only_shrink(recorded: Path) -> None:
    (recorded / "rest" / "module.py").write_text(CLEAN_MODULE, encoding="utf-8")
    result = typecheck(recorded)
    assert result.returncode == 1
    assert "take them out of the baseline" in result.stderr
    assert typecheck(recorded, "--update").returncode == 0
    result = typecheck(recorded)
    assert result.returncode == 0
    assert "no type errors" in result.stdout
    (recorded / "rest" / "module.py").write_text(SLOPPY_MODULE, encoding="utf-8")
    grown = typecheck(recorded, "--update")
    assert grown.returncode == 1 and "new type errors" in grown.stderr


def test_mypy_that_cannot_run_is_exit_2(tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / "pyproject.toml").write_text('[tool.mypy]\nfiles = ["missing"]\n', encoding="utf-8")
    result = typecheck(root)
    assert result.returncode == 2
    assert "mypy could not check the code" in result.stderr
