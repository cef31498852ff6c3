"""The progress line of a long bill: ``chargeback: 12/40 queries`` on stderr, rewritten in place.

Shown only on a terminal, never with ``--quiet``, and only once a bill has run for ``AFTER`` seconds: a bill that
answers at once prints nothing, and a bill written to a file by a cron job or a pipeline never writes control
characters into a log. The total is an estimate while the raw series are fetched in chunks sized on the way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import TextIO

AFTER = 2.0  # seconds before the line appears


@dataclass(eq=False)
class Progress:
    """How many of the bill's queries are done, on one line of ``stream`` once the bill has run ``after`` seconds."""

    stream: TextIO
    _: KW_ONLY
    enabled: bool
    after: float = AFTER
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)
    done: int = field(default=0, init=False)
    total: int = field(default=0, init=False)
    shown: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    @classmethod
    def for_terminal(cls, stream: TextIO, quiet: bool) -> Progress:
        """On when ``stream`` is a terminal and the user did not ask for quiet."""
        try:
            terminal = stream.isatty()
        except (AttributeError, ValueError):  # a closed or unusual stream
            terminal = False
        return cls(stream, enabled=terminal and not quiet)

    def expect(self, total: int) -> None:
        """The number of queries the bill will make in all (the best estimate so far)."""
        self.total = max(total, self.done)

    def advance(self, count: int = 1) -> None:
        self.done += count
        self.total = max(self.total, self.done)
        if self.enabled and self.clock() - self.started >= self.after:
            self.stream.write(f"\r\x1b[Kchargeback: {self.done}/{self.total} queries")
            self.stream.flush()
            self.shown = True

    def finish(self) -> None:
        """Clear the line, so that what follows on stderr (an error, the shell prompt) starts clean."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False
