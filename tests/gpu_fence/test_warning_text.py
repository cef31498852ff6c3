"""The warning limit and the cut: what the policy's advice and the review's warnings are held to."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpu_fence.warning_text import CONTINUATION, MAX_WARNING_CHARS, clip, split_warning, truncate_warning

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


def test_a_long_warning_goes_on_in_the_next_lines_between_words():
    text = 'privileged: container "notebook-init": ' + " ".join(f"word{i}" for i in range(60))
    lines = split_warning(text)
    assert len(lines) > 1 and all(len(line) <= MAX_WARNING_CHARS for line in lines)
    assert lines[0].startswith("privileged: ") and all(line.startswith(CONTINUATION) for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == text  # every word, in order, none cut


def test_a_word_longer_than_a_line_is_cut_inside_and_max_lines_cuts_the_rest():
    lines = split_warning("x" * 300)
    assert [len(line) for line in lines] == [MAX_WARNING_CHARS, MAX_WARNING_CHARS, 2 + 300 - 238]
    capped = split_warning("word " * 200, max_lines=3)
    assert len(capped) == 3 and capped[-1].endswith("…") and len(capped[-1]) <= MAX_WARNING_CHARS


@given(st.text(max_size=600), st.integers(min_value=20, max_value=200), st.integers(min_value=1, max_value=6))
def test_split_lines_fit_and_lose_nothing_but_what_max_lines_drops(text, limit, max_lines):
    lines = split_warning(text, limit)
    assert lines and all(len(line) <= limit and line.isprintable() for line in lines)
    assert "".join("".join(line.split()) for line in lines) == "".join(
        "".join(char if char.isprintable() else " " for char in text).split()
    )
    assert len(split_warning(text, limit, max_lines)) <= max_lines
