"""One exit-status enum for both command lines: the numbers, and the real entry points exiting with them."""

from __future__ import annotations

import sys

import pytest

from gpu_fence.exit_status import ExitStatus
from tests.fakes.processes import run_captured


def test_the_statuses_are_the_documented_numbers():
    assert [(status.name, int(status)) for status in ExitStatus] == [
        ("SUCCESS", 0),
        ("FINDINGS", 1),
        ("ERROR", 2),
        ("INTERRUPTED", 130),
    ]


@pytest.mark.parametrize(
    "program, args, status",
    [
        ("gpu_fence.webhook.cli", ["check", "--cluster", "x.yaml"], ExitStatus.ERROR),
        (
            "gpu_fence.auditor.cli",
            ["chargeback", "--prometheus", "http://127.0.0.1:1", "--start", "soon", "--price-per-gpu-hour", "1"],
            ExitStatus.ERROR,
        ),
    ],
)
def test_both_command_lines_exit_with_these_statuses(program, args, status):
    """The real console entry points, as a shell sees them: ``sys.exit(main())`` of an ``ExitStatus``."""
    result = run_captured([sys.executable, "-m", program, *args], timeout=60)
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
