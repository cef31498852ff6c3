"""The exit statuses of both command lines, and the one ``main`` that maps a subcommand's errors to them.

Both ``gpu-fence-webhook`` and ``gpu-fence-auditor`` exit 0 when all is well, 1 when the run found what it looks
for (``check``: a rejected pod spec; ``once``: a finding), 2 when it could not run (usage, unreadable input, bad
configuration, an unreachable API), and 130 when interrupted (128 + SIGINT, as shells report it). The shape is
httpie's: an ``ExitStatus`` enum (``httpie/status.py``) and a ``main`` that maps exceptions around a subcommand
that returns its status (``httpie/core.py``), in httpie/cli at commits 374c371e and 003d78e3.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from enum import IntEnum

__all__ = ["ExitStatus", "run_subcommand"]


class ExitStatus(IntEnum):
    """What a command line's exit code means; an ``int``, so ``sys.exit`` and shells read it as one."""

    SUCCESS = 0
    FINDINGS = 1  # check: some pod spec rejected; once: findings
    ERROR = 2  # could not run; the reason is one line on stderr
    INTERRUPTED = 130  # Ctrl-C


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
