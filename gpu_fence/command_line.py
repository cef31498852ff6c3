"""The shape both command lines share: one entry point, subcommands, and a ``main`` that maps what escapes a
subcommand to an exit status; and the conventions every subcommand gets from here rather than from each module.

``gpu-fence-webhook`` and ``gpu-fence-auditor`` differ only in their name, words and subcommands; each subcommand
module contributes ``add_arguments(subparsers)``, which sets its ``run(args) -> ExitStatus`` as the default. The
shape is httpie's: a ``main`` that maps exceptions around a subcommand that returns its status (``httpie/core.py``,
httpie/cli commit 003d78e3).

The conventions, applied to the entry point and to every subcommand parser once they are all added:

* ``--version`` prints the package version (``gpu_fence.version``);
* ``--debug`` is accepted before the subcommand and after it (``gpu-fence-webhook check --debug ...``);
* ``--help`` shows every option's default (:class:`HelpFormatter`) and keeps the examples' line breaks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from .exit_status import ExitStatus
from .version import package_version

__all__ = ["HelpFormatter", "build_parser", "run_subcommand"]

DEBUG_HELP = "show tracebacks on errors"

#: A subcommand module's ``add_arguments``.
AddArguments = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (the examples keep their lines), and every option's default said.

    Unlike ``argparse.ArgumentDefaultsHelpFormatter``, a help text that already says its default (most explain it:
    ``default: $NODE_NAME, else the host name``) is left alone, and flags (default ``False``) and options with no
    default (``None``, or an empty list for repeatable ones) get no ``(default: None)``.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in help_text
            or default is None
            or default is False
            or default == []
            or default is argparse.SUPPRESS
            or isinstance(action, argparse._VersionAction | argparse._HelpAction)
        ):
            return action.help
        return f"{help_text} (default: %(default)s)".lstrip()


Number = TypeVar("Number", int, float)


def positive(convert: Callable[[str], Number], noun: str, least: str = "greater than 0") -> Callable[[str], Number]:
    """An argparse ``type`` for a number above zero: ``convert`` reads it, ``noun`` says in the error what it is."""

    def parse(text: str) -> Number:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {noun}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be {least}")
        return value

    return parse


def build_parser(
    prog: str, description: str, epilog: str, subcommands: Iterable[AddArguments]
) -> argparse.ArgumentParser:
    """The entry point's parser: ``--version``, ``--debug``, then one required subcommand from each of
    ``subcommands``, every subcommand with the conventions of this module (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"{prog} {package_version()}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_arguments in subcommands:
        add_arguments(subparsers)
    for subparser in _subcommand_parsers(parser):
        subparser.formatter_class = HelpFormatter
        # SUPPRESS: the subcommand sets args.debug only when --debug follows it, never resets the entry point's
        subparser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def _subcommand_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every subcommand's parser under ``parser``, nested ones included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                yield subparser
                yield from _subcommand_parsers(subparser)


def run_subcommand(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> ExitStatus:
    """Parse ``argv`` and run the chosen subcommand (its ``run`` default), mapping what escapes it to a status.

    A subcommand reports the errors it expects itself, as one line on stderr, and returns its status; anything
    else that escapes becomes one line too, ``<prog> <command>: error: <message>``, and status 2, unless
    ``--debug`` asks for the traceback. argparse exits 2 on usage errors before any subcommand runs.
    """
    args = parser.parse_args(argv)
    try:
        return ExitStatus(args.run(args))
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED
    except Exception as error:
        if args.debug:
            raise
        print(f"{parser.prog} {args.command}: error: {error}", file=sys.stderr)
        return ExitStatus.ERROR
