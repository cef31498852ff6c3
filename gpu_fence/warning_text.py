"""How long an admission warning may be, and how text is cut to a length.

The Kubernetes documentation on admission webhooks asks for warnings of at most 120 characters ("Keep each to ≤120
chars"; one over 256 may be truncated by the API server, and past 4096 characters from all sources they are
dropped). The policy writes its advice within the limit and the review envelope holds every warning it returns to
it, so both take the limit and the cut from here.
"""

from __future__ import annotations

__all__ = ["MAX_WARNING_CHARS", "clip", "truncate_warning"]

MAX_WARNING_CHARS = 120


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked by an ellipsis (which counts in the limit)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def truncate_warning(text: str, limit: int = MAX_WARNING_CHARS) -> str:
    """A warning as the API server can return it: control characters replaced by spaces, then clipped.

    Characters, not bytes: Python strings cannot split a UTF-8 sequence. Control characters are replaced because a
    warning becomes an HTTP ``Warning`` header on the client side.
    """
    return clip("".join(char if char.isprintable() else " " for char in text), limit)
