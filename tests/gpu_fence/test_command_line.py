"""The shape both command lines share: the parser with ``--debug`` and subcommands, and the ``main`` that maps what
escapes a subcommand to an exit status."""

from __future__ import annotations

import argparse

import pytest

from gpu_fence.command_line import build_parser, positive, run_subcommand
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
    assert out.startswith("usage: gpu-fence-test [-h] [--version] [--debug] COMMAND ...")
    assert (
        "A test command." in out and "examples:\n  gpu-fence-test go\n" in out and "--debug     show tracebacks" in out
    )


def test_a_subcommand_is_required(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_subcommand(parser_running(lambda args: ExitStatus.SUCCESS), [])
    assert exit_.value.code == ExitStatus.ERROR
    assert "the following arguments are required: COMMAND" in capsys.readouterr().err


def test_debug_after_the_subcommand_shows_the_traceback_too():
    def run(args):
        raise OSError("the disk is full")

    with pytest.raises(OSError, match="the disk is full"):
        run_subcommand(parser_running(run), ["go", "--debug"])


@pytest.mark.parametrize(("argv", "debug"), [(["go"], False), (["--debug", "go"], True), (["go", "--debug"], True)])
def test_debug_before_or_after_the_subcommand(argv, debug):
    assert parser_running(lambda args: ExitStatus.SUCCESS).parse_args(argv).debug is debug


def test_version_says_the_package_version(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as exit_:
        run_subcommand(parser_running(lambda args: ExitStatus.SUCCESS), ["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"gpu-fence-test {metadata.version('gpu-fence')}\n"


def test_help_says_each_default_once(capsys):
    def go(subparsers) -> None:
        sub = subparsers.add_parser("go")
        sub.add_argument("--colour", default="blue", help="paint it")
        sub.add_argument("--size", default=3, help="how big (default: 3, the usual)")
        sub.add_argument("--loud", action="store_true", help="shout")
        sub.add_argument("--name", help="who")
        sub.set_defaults(run=lambda args: ExitStatus.SUCCESS)

    parser = build_parser("gpu-fence-test", "A test command.", "", [go])
    with pytest.raises(SystemExit):
        parser.parse_args(["go", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--colour COLOUR paint it (default: blue)" in out
    assert "--size SIZE how big (default: 3, the usual)" in out and "(default: 3)" not in out
    assert "--loud shout --name NAME who --debug" in out  # no (default: False), no (default: None)


@pytest.mark.parametrize(
    ("convert", "noun", "text", "error"),
    [
        (float, "number", "soon", "'soon' is not a number"),
        (float, "number", "0", "'0' must be greater than 0"),
        (float, "number", "-1.5", "'-1.5' must be greater than 0"),
        (int, "whole number of days", "1.5", "'1.5' is not a whole number of days"),
    ],
)
def test_positive_names_what_it_wanted(convert, noun, text, error):
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{error}$"):
        positive(convert, noun)(text)


def test_positive_passes_a_positive_number_through_its_converter():
    assert positive(float, "number")("0.25") == 0.25
    assert positive(int, "whole number of days")("7") == 7
