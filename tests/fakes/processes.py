"""Stopping a child process the one way the harness does it: a polite signal, a grace period, then SIGKILL.

Standard library only: ``scripts/gpu-smoke.py`` loads this file by path to stop its CUDA holder, on machines where
the test suite's other dependencies may be missing.
"""

from __future__ import annotations

import subprocess


def stop(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM (gunicorn's graceful shutdown; the holder's last resort), SIGKILL when the process has not exited
    after ``grace_s``; always reaped. A process that has already exited is only reaped."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
