"""How long an admission warning may be, and how text is cut to a length.

The Kubernetes documentation on admission webhooks asks for warnings of at most 120 characters ("Keep each to ≤120
chars"; one over 256 may be truncated by the API server, and past 4096 characters from all sources they are
dropped). The policy writes its advice within the limit and the review envelope holds every warning it returns to
it, so both take the limit and the cut from here.
"""

from __future__ import annotations

__all__ = ["CONTINUATION", "MAX_WARNING_CHARS", "clip", "split_warning", "truncate_warning"]

MAX_WARNING_CHARS = 120
#: How a warning that goes on from the one before starts, so that a reader sees one piece of advice in several lines.
CONTINUATION = "  "


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked by an ellipsis (which counts in the limit)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def truncate_warning(text: str, limit: int = MAX_WARNING_CHARS) -> str:
    """A warning as the API server can return it: control characters replaced by spaces, then clipped.

    Characters, not bytes: Python strings cannot split a UTF-8 sequence. Control characters are replaced because a
    warning becomes an HTTP ``Warning`` header on the client side.
    """
    return clip(_printable(text), limit)


def _printable(text: str) -> str:
    """``text`` with control characters replaced by spaces; the usual text, all printable, is returned as it is
    (one C-level scan instead of a character loop: every warning of every review passes here)."""
    return text if text.isprintable() else "".join(char if char.isprintable() else " " for char in text)


def split_warning(text: str, limit: int = MAX_WARNING_CHARS, max_lines: int | None = None) -> list[str]:
    """``text`` as warnings of at most ``limit`` characters, cut between words where it can be (a word longer than
    a line is cut inside), each after the first starting with :data:`CONTINUATION`. Control characters are replaced
    as in :func:`truncate_warning`. With ``max_lines``, what does not fit in that many lines is cut, the last line
    ending with an ellipsis."""
    limit = max(limit, len(CONTINUATION) + 1)  # each continued line carries at least one character on
    words = _printable(text).split()
    lines: list[str] = []
    line = ""
    for word in words:
        if line and len(line) + 1 + len(word) <= limit:
            line = f"{line} {word}"
            continue
        if line:
            lines.append(line)
        line = (CONTINUATION if lines else "") + word
        while len(line) > limit:
            lines.append(line[:limit])
            line = CONTINUATION + line[limit:]
    if line or not lines:
        lines.append(line)
    if max_lines is not None and len(lines) > max_lines:
        lines = [*lines[: max_lines - 1], clip(lines[max_lines - 1] + " …", limit)]
    return lines
