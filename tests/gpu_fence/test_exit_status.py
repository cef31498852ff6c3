"""One exit-status enum for both command lines, and the ``main`` that maps a subcommand's errors to it."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from gpu_fence.exit_status import ExitStatus, run_subcommand


def test_the_statuses_are_the_documented_numbers():
    assert [(status.name, int(status)) for status in ExitStatus] == [
        ("SUCCESS", 0),
        ("FINDINGS", 1),
        ("ERROR", 2),
        ("INTERRUPTED", 130),
    ]


def parser_running(run) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-fence-test")
    parser.add_argument("--debug", action="store_true")
    subparsers = parser.add_subparsers(dest="command", required=True)
    subparsers.add_parser("go").set_defaults(run=run)
    return parser


@pytest.mark.parametrize("status", list(ExitStatus))
def test_a_subcommand_status_is_the_exit_status(status, capsys):
    assert run_subcommand(parser_running(lambda args: status), ["go"]) is status
    assert capsys.readouterr().err == ""


def test_an_escaping_error_is_one_line_and_status_2(capsys):
    def run(args):
        raise OSError("the disk is full")

    assert run_subcommand(parser_running(run), ["go"]) is ExitStatus.ERROR
    assert capsys.readouterr().err == "gpu-fence-test go: error: the disk is full\n"


def test_debug_shows_the_traceback_instead():
    def run(args):
        raise OSError("the disk is full")

    with pytest.raises(OSError, match="the disk is full"):
        run_subcommand(parser_running(run), ["--debug", "go"])


def test_ctrl_c_is_130(capsys):
    def run(args):
        raise KeyboardInterrupt

    assert run_subcommand(parser_running(run), ["go"]) is ExitStatus.INTERRUPTED
    assert capsys.readouterr().err == ""


def test_usage_errors_exit_2_before_any_subcommand_runs(capsys):
    ran = []
    with pytest.raises(SystemExit) as exit_:
        run_subcommand(parser_running(ran.append), ["nope"])
    assert exit_.value.code == ExitStatus.ERROR and ran == []
    assert "invalid choice: 'nope'" in capsys.readouterr().err


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
    result = subprocess.run(
        [sys.executable, "-m", program, *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
