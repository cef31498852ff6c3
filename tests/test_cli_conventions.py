"""The conventions both command lines share, over every subcommand of the real parsers and the console scripts:
``--version``, ``--debug`` after the subcommand, ``-o/--output`` wherever a report is written, defaults shown in
``--help``, one kubeconfig order. ``tests/gpu_fence/test_command_line.py`` tests the shared code on its own."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

import pytest

from gpu_fence.auditor import cli as auditor_cli
from gpu_fence.command_line import HelpFormatter
from gpu_fence.kubeconfig import ORDER
from gpu_fence.webhook import cli as webhook_cli
from tests.fakes.processes import run_captured

PARSERS = {"gpu-fence-webhook": webhook_cli.build_parser(), "gpu-fence-auditor": auditor_cli.build_parser()}


def subcommands() -> list[tuple[str, str, argparse.ArgumentParser]]:
    found = []
    for prog, parser in PARSERS.items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [(prog, name, subparser) for name, subparser in action.choices.items()]
    return found


SUBCOMMANDS = subcommands()
IDS = [f"{prog} {name}" for prog, name, _ in SUBCOMMANDS]


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


def test_every_subcommand_is_covered() -> None:
    assert {(prog, name) for prog, name, _ in SUBCOMMANDS} == {
        ("gpu-fence-webhook", "serve"),
        ("gpu-fence-webhook", "certs"),
        ("gpu-fence-webhook", "check"),
        ("gpu-fence-auditor", "once"),
        ("gpu-fence-auditor", "run"),
        ("gpu-fence-auditor", "chargeback"),
    }


@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_version_is_the_package_version(prog: str) -> None:
    done = run_captured([str(Path(sys.executable).with_name(prog)), "--version"], timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"{prog} {metadata.version('gpu-fence')}\n"


@pytest.mark.parametrize(("prog", "name", "parser"), SUBCOMMANDS, ids=IDS)
def test_debug_is_accepted_after_the_subcommand(prog: str, name: str, parser: argparse.ArgumentParser) -> None:
    debug = options(parser)["--debug"]
    assert debug.default is argparse.SUPPRESS  # so that it never resets a --debug given before the subcommand


@pytest.mark.parametrize(("prog", "name", "parser"), SUBCOMMANDS, ids=IDS)
def test_every_report_can_be_written_with_o_or_output(prog: str, name: str, parser: argparse.ArgumentParser) -> None:
    found = options(parser)
    if "--format" in found:  # a subcommand that writes a report
        assert found["-o"] is found["--output"]


@pytest.mark.parametrize(("prog", "name", "parser"), SUBCOMMANDS, ids=IDS)
def test_help_shows_every_default(prog: str, name: str, parser: argparse.ArgumentParser) -> None:
    assert parser.formatter_class is HelpFormatter
    shown = "".join(parser.format_help().split())  # no whitespace at all: help is wrapped, at hyphens too
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.default in (None, False, [], argparse.SUPPRESS):
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        text = formatter._expand_help(action)
        assert "default" in text, f"{prog} {name} {action.option_strings[0]}: its help does not say its default"
        assert "".join(text.split()) in shown


@pytest.mark.parametrize(("prog", "name", "parser"), SUBCOMMANDS, ids=IDS)
def test_every_kubeconfig_option_says_the_one_order(prog: str, name: str, parser: argparse.ArgumentParser) -> None:
    found = options(parser)
    if "--kubeconfig" in found:
        assert ORDER in found["--kubeconfig"].help


def test_the_client_is_configured_in_one_place_only() -> None:
    """Every command that reads a kubeconfig goes through gpu_fence.kubeconfig (--kubeconfig, $KUBECONFIG,
    ~/.kube/config, in-cluster); no module loads the client's configuration on its own."""
    repo = Path(__file__).resolve().parents[1]
    loaders = ("load_kube_config", "load_incluster_config", "new_client_from_config")
    offenders = [
        str(path.relative_to(repo))
        for folder in ("gpu_fence", "webhook", "auditor")
        for path in (repo / folder).rglob("*.py")
        if path.name != "kubeconfig.py" and any(loader in path.read_text(encoding="utf-8") for loader in loaders)
    ]
    assert offenders == []


def test_chargeback_writes_its_report_with_o(tmp_path: Path) -> None:
    target = tmp_path / "bill.csv"
    done = run_captured(
        [
            str(Path(sys.executable).with_name("gpu-fence-auditor")),
            "chargeback",
            "--demo",
            "--format",
            "csv",
            "-o",
            str(target),
        ],
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, ""), done.stderr
    assert target.read_text(encoding="utf-8").startswith("kind,group,")
