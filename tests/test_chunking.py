"""channels/outbound/chunking.py: limits, break preference, code fences, graphemes, CJK."""

from __future__ import annotations

import re

import pytest

from channels.outbound.chunking import (
    DISCORD_LIMIT,
    SLACK_LIMIT,
    TELEGRAM_LIMIT,
    split_text,
    utf16_len,
)

try:
    from hypothesis import example, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is optional
    given = None


def _letters(s: str) -> str:
    return re.sub(r"\s", "", s)


def test_platform_constants() -> None:
    assert (TELEGRAM_LIMIT, DISCORD_LIMIT, SLACK_LIMIT) == (4096, 2000, 4000)


def test_utf16_len_counts_astral_twice() -> None:
    assert utf16_len("abc") == 3
    assert utf16_len("😀") == 2
    assert utf16_len("é中😀") == 4


@pytest.mark.parametrize("text", ["", "   ", "\n\n \t\n"])
def test_empty_text_gives_no_chunks(text: str) -> None:
    assert split_text(text, 100) == []


def test_short_text_is_one_stripped_chunk() -> None:
    assert split_text("\n\n  hello world  \n\n", 100) == ["  hello world"]


def test_bad_limit_is_rejected() -> None:
    with pytest.raises(ValueError, match="limit"):
        split_text("abc", 0)


def test_prefers_paragraph_boundaries() -> None:
    a, b, c = "A" * 30 + ".", "B" * 30 + ". More b.", "C" * 20
    text = f"{a}\n\n{b}\n\n{c}"
    # a+b do not fit in 60: the break falls on the blank line, not mid-paragraph
    assert split_text(text, 60) == [a, b, c]
    # A window that fits a and b exactly breaks on the blank line after b.
    assert split_text(text, len(a) + 2 + len(b)) == [f"{a}\n\n{b}", c]
    # A window that ends inside c still prefers the blank line over c's words.
    assert split_text(text, len(a) + 2 + len(b) + 15) == [f"{a}\n\n{b}", c]


def test_line_then_sentence_then_word_then_hard() -> None:
    lines = "first line here\nsecond line here"
    assert split_text(lines, 20) == ["first line here", "second line here"]
    sentences = "One two three. Four five six! Seven eight?"
    assert split_text(sentences, 30) == ["One two three. Four five six!", "Seven eight?"]
    words = "alpha beta gamma delta"
    assert split_text(words, 12) == ["alpha beta", "gamma delta"]
    assert split_text("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_cjk_sentence_boundaries() -> None:
    text = "今天天气很好。我们去公园散步吧！你觉得怎么样？好的。"
    chunks = split_text(text, 12)
    assert chunks == ["今天天气很好。", "我们去公园散步吧！", "你觉得怎么样？好的。"]
    assert all(len(c) <= 12 for c in chunks)


def test_utf16_limit_counts_emoji_twice_and_never_splits_them() -> None:
    text = "😀" * 10  # 20 UTF-16 units
    chunks = split_text(text, 5, length=utf16_len)
    assert all(utf16_len(c) <= 5 for c in chunks)
    assert "".join(chunks) == text
    assert chunks[0] == "😀😀"


@pytest.mark.parametrize("cluster", [
    "❤️",  # heart + variation selector 16
    "👩\u200d💻",  # ZWJ sequence
    "👍🏽",  # skin tone modifier
    "🇯🇵",  # flag (regional indicator pair)
    "e\u0301",  # combining acute
    "1️⃣",  # keycap
])
def test_hard_cut_keeps_grapheme_clusters(cluster: str) -> None:
    text = ("ab" + cluster) * 12
    for limit in range(len(cluster) + 2, len(cluster) + 9):
        chunks = split_text(text, limit)
        assert "".join(chunks) == text
        for c in chunks:
            assert len(c) <= limit
            # each chunk is whole clusters: removing all clusters leaves only a/b
            assert set(c.replace(cluster, "")) <= {"a", "b"}, (limit, chunks)


def test_code_fence_closed_and_reopened_with_info_string() -> None:
    code = "\n".join(f"    line_{i} = {i}" for i in range(40))
    text = f"Intro text.\n\n```python\n{code}\n```\n\nOutro."
    limit = 200
    chunks = split_text(text, limit)
    assert all(len(c) <= limit for c in chunks)
    code_chunks = [c for c in chunks if "line_" in c]
    assert len(code_chunks) >= 3
    for c in code_chunks:
        assert c.startswith("```python\n"), c
        assert "\n```" in c, c  # closed: by an added fence or the original one
        # indentation inside code is kept
        assert "\n    line_" in c
    # every code line appears exactly once, in order
    seen = [ln.strip() for c in code_chunks for ln in c.splitlines() if "line_" in ln]
    assert seen == [f"line_{i} = {i}" for i in range(40)]
    assert all(c.endswith("\n```") for c in code_chunks[:-1])
    assert chunks[0] == "Intro text."
    assert chunks[-1].endswith("```\n\nOutro.")


def test_fence_lines_count_toward_limit_with_tildes_and_utf16() -> None:
    body = "\n".join("😀 x" * 5 for _ in range(30))
    text = f"~~~~ js extra\n{body}\n~~~~"
    chunks = split_text(text, 80, length=utf16_len)
    assert len(chunks) > 2
    for c in chunks:
        assert utf16_len(c) <= 80
        assert c.startswith("~~~~ js extra\n") and c.endswith("\n~~~~")


def test_long_single_code_line_is_hard_cut_inside_fence() -> None:
    text = "```\n" + "z" * 100 + "\n```"
    chunks = split_text(text, 40)
    assert all(len(c) <= 40 for c in chunks)
    assert all(c.startswith("```\n") and c.endswith("\n```") for c in chunks)
    assert "".join(c[4:-4] for c in chunks) == "z" * 100


def test_unclosed_fence_is_closed_only_where_split() -> None:
    text = "```sh\n" + "\n".join(f"echo {i}" for i in range(20))
    chunks = split_text(text, 60)
    assert all(len(c) <= 60 for c in chunks)
    assert all(c.endswith("\n```") for c in chunks[:-1])
    assert not chunks[-1].endswith("```")
    assert chunks[-1].startswith("```sh\n")


def test_no_empty_code_blocks_and_no_broken_fence_lines() -> None:
    text = "para\n\n```python\nprint(1)\nprint(2)\n```\n\nafter"
    for limit in range(22, 60):
        for c in split_text(text, limit):
            assert len(c) <= limit
            assert c not in ("```python\n```", "```python", "```")
            assert not re.search(r"```pyt?h?o?$", c.split("\n")[0][:9]) or \
                c.startswith("```python")


def test_crlf_normalised() -> None:
    assert split_text("a\r\nb\r\n\r\nc", 100) == ["a\nb\n\nc"]


def test_custom_length_function() -> None:
    # A length that counts bytes: CJK = 3 each.
    def nbytes(s: str) -> int:
        return len(s.encode())
    chunks = split_text("中文字符" * 10, 30, length=nbytes)
    assert all(nbytes(c) <= 30 for c in chunks)
    assert "".join(chunks) == "中文字符" * 10


def test_large_text_is_fast_enough() -> None:
    import time
    text = ("word " * 200 + "\n\n") * 500  # ~500 KB
    t0 = time.perf_counter()
    chunks = split_text(text, TELEGRAM_LIMIT, length=utf16_len)
    assert time.perf_counter() - t0 < 5.0
    assert all(utf16_len(c) <= TELEGRAM_LIMIT for c in chunks)
    assert _letters("".join(chunks)) == _letters(text)


if given is not None:
    _alphabet = st.sampled_from(list("ab c.!?。\n\n ") + ["😀", "❤️", "中", "é", "`"])

    @settings(max_examples=300, deadline=None)
    @given(st.lists(_alphabet, max_size=400).map("".join), st.integers(min_value=8,
                                                                        max_value=120))
    def test_property_limits_hold(text: str, limit: int) -> None:
        for length in (len, utf16_len):
            chunks = split_text(text, limit, length=length)
            assert all(length(c) <= limit for c in chunks)
            assert all(c.strip() for c in chunks)
            assert all(not c.startswith("\n") and not c.endswith(("\n", " ")) for c in chunks)
            if "`" not in text:  # no fences added: no visible character lost or invented
                assert _letters("".join(chunks)) == _letters(text)

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.sampled_from(["```py\n", "```\n", "x = 1\n", "text. ", "\n\n",
                                     "long line of code here\n", "😀"]), max_size=60)
           .map("".join), st.integers(min_value=30, max_value=200))
    @example("```py\n" * 6, 30)  # fence-looking lines inside an unclosed block are code
    @example("```py\n```\n```\ntext. text. ```py\n", 30)  # the cut-off tail looks like a fence
    def test_property_fenced_limits_hold(text: str, limit: int) -> None:
        chunks = split_text(text, limit, length=utf16_len)
        assert all(utf16_len(c) <= limit for c in chunks)
        # content outside the fence markers is preserved (a ```py that ended a line in the
        # source may start one in a chunk, so markers are dropped wherever they stand)
        def strip_fences(s: str) -> str:
            return _letters(re.sub(r"```\w*", "", s))
        assert strip_fences("\n".join(chunks)) == strip_fences(text)


def test_code_that_looks_like_a_fence_is_kept_when_it_ends_up_alone_in_a_chunk():
    """Inside an unclosed block, the tail ```` ```py ```` of a line is code. Cut off into a
    chunk of its own it must be sent, not taken for that chunk's wrapping fence (found by
    hypothesis: the reply's tail was dropped)."""
    text = "```py\n```\n```\ntext. text. ```py\n"
    chunks = split_text(text, 30, length=utf16_len)
    assert all(utf16_len(c) <= 30 for c in chunks)
    assert "\n".join(chunks).count("```py") == 2
