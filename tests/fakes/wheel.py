"""The project's wheel, built from this checkout as a release builds it, for the tests that install or read it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def build_wheel(out: Path) -> Path:
    """Build the wheel into ``out`` and return its path. No build isolation: setuptools is in the test environment
    (the ``test`` extra), so the build needs no network."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("gpu_fence-*.whl")
    return built
