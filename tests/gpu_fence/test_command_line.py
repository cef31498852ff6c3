"""The shape both command lines share: the parser with ``--debug`` and subcommands, and the ``main`` that maps what
escapes a subcommand to an exit status."""

from __future__ import annotations

import argparse

import pytest

from gpu_fence.command_line import build_parser, run_subcommand
from gpu_fence.exit_status import ExitStatus


def parser_running(run) -> argparse.ArgumentParser:
    def go(subparsers) -> None:
        subparsers.add_parser("go").set_defaults(run=run)

    return build_parser("gpu-fence-test", "A test command.", "examples:\n  gpu-fence-test go\n", [go])


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


def test_help_shows_the_words_the_example_and_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_subcommand(parser_running(lambda args: ExitStatus.SUCCESS), ["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gpu-fence-test [-h] [--debug] COMMAND ...")
    assert (
        "A test command." in out and "examples:\n  gpu-fence-test go\n" in out and "--debug     show tracebacks" in out
    )


def test_a_subcommand_is_required(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_subcommand(parser_running(lambda args: ExitStatus.SUCCESS), [])
    assert exit_.value.code == ExitStatus.ERROR
    assert "the following arguments are required: COMMAND" in capsys.readouterr().err
