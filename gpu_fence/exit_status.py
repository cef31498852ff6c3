"""The exit statuses of both command lines.

Both ``gpu-fence-webhook`` and ``gpu-fence-auditor`` exit 0 when all is well, 1 when the run found what it looks
for (``check``: a rejected pod spec; ``once``: a finding), 2 when it could not run (usage, unreadable input, bad
configuration, an unreachable API), and 130 when interrupted (128 + SIGINT, as shells report it). The enum is
httpie's idea (``ExitStatus`` in ``httpie/status.py``, httpie/cli commit 374c371e); ``command_line.run_subcommand``
maps what escapes a subcommand to it.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitStatus"]


class ExitStatus(IntEnum):
    """What a command line's exit code means; an ``int``, so ``sys.exit`` and shells read it as one."""

    SUCCESS = 0
    FINDINGS = 1  # check: some pod spec rejected; once: findings
    ERROR = 2  # could not run; the reason is one line on stderr
    INTERRUPTED = 130  # Ctrl-C
