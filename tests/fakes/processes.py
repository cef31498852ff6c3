"""Child processes the way the harness runs them: stopped with a polite signal, a grace period, then SIGKILL; run
to their end with their output captured.

Standard library only: ``scripts/gpu-smoke.py`` loads this file by path to stop its CUDA holder, on machines where
the test suite's other dependencies may be missing.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping


def stop(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM (gunicorn's graceful shutdown; the holder's last resort), SIGKILL when the process has not exited
    after ``grace_s``; always reaped. A process that has already exited is only reaped."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_captured(
    args: list[str],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end, its stdout and stderr captured as text; a non-zero exit is returned, not raised,
    for the test to assert on with the output in its message, and a command still running after ``timeout``
    seconds raises ``subprocess.TimeoutExpired``."""
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
