"""The shape both command lines share: one entry point, subcommands, ``--debug``, and a ``main`` that maps what
escapes a subcommand to an exit status.

``gpu-fence-webhook`` and ``gpu-fence-auditor`` differ only in their name, words and subcommands; each subcommand
module contributes ``add_arguments(subparsers)``, which sets its ``run(args) -> ExitStatus`` as the default. The
shape is httpie's: a ``main`` that maps exceptions around a subcommand that returns its status (``httpie/core.py``,
httpie/cli commit 003d78e3).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence

from .exit_status import ExitStatus

__all__ = ["build_parser", "run_subcommand"]

#: A subcommand module's ``add_arguments``.
AddArguments = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def build_parser(
    prog: str, description: str, epilog: str, subcommands: Iterable[AddArguments]
) -> argparse.ArgumentParser:
    """The entry point's parser: ``--debug``, then one required subcommand from each of ``subcommands``."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_arguments in subcommands:
        add_arguments(subparsers)
    return parser


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
