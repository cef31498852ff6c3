"""The one error type chargeback turns every expected failure into: the command prints its message and exits 2."""


class ChargebackError(Exception):
    """A reason the bill cannot be made, worded as what to fix (one line, no traceback)."""
