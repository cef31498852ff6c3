"""The warning limit and the cut: what the policy's advice and the review's warnings are held to."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpu_fence.warning_text import MAX_WARNING_CHARS, clip, truncate_warning

DOCS = Path(__file__).parents[2] / "docs"


def test_the_limit_is_the_one_the_docs_state():
    """docs/policy.md (the policy's advice) and docs/webhook.md (every warning returned) name the limit."""
    for page in ("policy.md", "webhook.md"):
        assert f"at most {MAX_WARNING_CHARS} characters" in (DOCS / page).read_text(), page


def test_clip_marks_the_cut_within_the_limit():
    assert clip("abcdef", 6) == "abcdef"
    assert clip("abcdefg", 6) == "abcde…"
    assert clip("", 1) == ""


@given(st.text(max_size=400), st.integers(min_value=1, max_value=200))
def test_clipped_text_fits_and_keeps_what_fits(text, limit):
    out = clip(text, limit)
    assert len(out) <= limit
    assert out == (text if len(text) <= limit else text[: limit - 1] + "…")


@given(st.text(max_size=400))
def test_truncated_warnings_fit_and_keep_short_ones(text):
    out = truncate_warning(text)
    assert len(out) <= MAX_WARNING_CHARS
    assert all(char.isprintable() for char in out)
    if len(text) <= MAX_WARNING_CHARS and text.isprintable():
        assert out == text


def test_control_characters_become_spaces_before_the_cut():
    assert truncate_warning("a\nb\x00c", 4) == "a b…"
