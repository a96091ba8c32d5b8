"""channels/outbound/markup.py and channels/outbound/render.py: per-platform conversion, escaping, limits."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from channels.outbound.chunking import utf16_len
from channels.outbound.markup import (
    convert_with_plain,
    to_discord,
    to_plain,
    to_slack_mrkdwn,
    to_telegram_html,
)
from channels.outbound.render import RenderedChunk, render_chunks

TELEGRAM_TAGS = {"b", "i", "s", "u", "code", "pre", "a", "blockquote"}


class _TagChecker(HTMLParser):
    """Asserts balanced tags from Telegram's allowed set."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        assert tag in TELEGRAM_TAGS, tag
        if tag == "a":
            assert [k for k, _ in attrs] == ["href"]
        if tag == "code" and attrs:
            assert attrs[0][0] == "class" and attrs[0][1].startswith("language-")
        self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (self.stack, tag)
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def check_telegram(html: str) -> str:
    """Parse Telegram HTML strictly; returns the visible text."""
    assert not re.search(r"&(?!(amp|lt|gt|quot);)", html), html  # bare & only as entity
    p = _TagChecker()
    p.feed(html)
    p.close()
    assert p.stack == []
    return "".join(p.text)


SAMPLE = """# Title with **bold**

Intro with *italic*, _also italic_, ~~strike~~, `code <b>x</b>` and [a link](https://example.com/a?b=1&c=2).
Second line <b>not a tag</b> & AT&T.

- item **one**
- item two
  1. nested [x](http://x.io)

> quoted *text*

```python
if a < b and c > d:
    print("**not bold** & <tag>")
```
"""


# --- Telegram -------------------------------------------------------------------------------

def test_telegram_escapes_user_html_and_keeps_only_allowed_tags() -> None:
    out = to_telegram_html("Hi <b>there</b> & <script>alert(1)</script>")
    assert out == "Hi &lt;b&gt;there&lt;/b&gt; &amp; &lt;script&gt;alert(1)&lt;/script&gt;"
    assert check_telegram(out) == "Hi <b>there</b> & <script>alert(1)</script>"


def test_telegram_sample() -> None:
    out = to_telegram_html(SAMPLE)
    visible = check_telegram(out)
    assert "<b>Title with bold</b>" in out
    assert "<i>italic</i>" in out and "<i>also italic</i>" in out and "<s>strike</s>" in out
    assert "<code>code &lt;b&gt;x&lt;/b&gt;</code>" in out
    assert '<a href="https://example.com/a?b=1&amp;c=2">a link</a>' in out
    assert "Second line &lt;b&gt;not a tag&lt;/b&gt; &amp; AT&amp;T." in out
    assert "• item <b>one</b>\n• item two\n  1. nested" in out
    assert "<blockquote>quoted <i>text</i></blockquote>" in out
    assert ('<pre><code class="language-python">if a &lt; b and c &gt; d:\n'
            '    print("**not bold** &amp; &lt;tag&gt;")</code></pre>') in out
    assert "**" not in visible.replace('"**not bold**', "")


def test_telegram_code_content_never_formatted() -> None:
    out = to_telegram_html("`**a** _b_ [c](d)`")
    assert out == "<code>**a** _b_ [c](d)</code>"


def test_telegram_nested_bold_italic() -> None:
    out = to_telegram_html("***both*** and **bold _inner_ bold**")
    check_telegram(out)
    assert "<b>bold <i>inner</i> bold</b>" in out
    assert re.search(r"<(i|b)><(b|i)>both</\2></\1>", out)


def test_telegram_href_quotes_escaped_and_unsafe_links_dropped() -> None:
    out = to_telegram_html('[x](http://a.b/"q")')
    check_telegram(out)
    assert 'href="http://a.b/%22q%22"' in out or "&quot;" in out
    out = to_telegram_html("[x](javascript:alert(1))")
    assert "<a" not in out
    check_telegram(out)


def test_telegram_nested_quotes_not_nested_tags_and_unbalanced_markdown() -> None:
    out = to_telegram_html("> a\n> > b\n\n**unclosed *mixed_ ~~x")
    check_telegram(out)
    assert out.count("<blockquote>") == 1
    assert "**unclosed" in out


def test_telegram_table_and_hr() -> None:
    out = to_telegram_html("| a | bb |\n|---|---|\n| 1 | 2 |\n\n---\n\nend")
    check_telegram(out)
    assert "<pre>a | bb\n--+---\n1 | 2</pre>" in out
    assert "———" in out


# --- Slack ----------------------------------------------------------------------------------

def test_slack_sample() -> None:
    out = to_slack_mrkdwn(SAMPLE)
    assert out.startswith("*Title with bold*\n")
    assert "_italic_" in out and "_also italic_" in out and "~strike~" in out
    assert "`code &lt;b&gt;x&lt;/b&gt;`" in out
    assert "<https://example.com/a?b=1&amp;c=2|a link>" in out
    assert "Second line &lt;b&gt;not a tag&lt;/b&gt; &amp; AT&amp;T." in out
    assert "• item *one*" in out
    assert "> quoted _text_" in out
    assert '```\nif a &lt; b and c &gt; d:\n    print("**not bold** &amp; &lt;tag&gt;")\n```' in out


def test_slack_cannot_forge_mentions_and_autolinks() -> None:
    out = to_slack_mrkdwn("<!channel> <@U123> <http://x.y>")
    assert "<!channel>" not in out and "<@U123>" not in out
    assert "&lt;!channel&gt;" in out
    assert "<http://x.y>" in out


def test_slack_bold_markers_hug_text() -> None:
    # Slack only formats when the marker touches a non-space: spaces move outside.
    assert to_slack_mrkdwn("**&nbsp;bold** x") == "\xa0*bold* x"
    assert to_slack_mrkdwn("__a _b_ c__") == "*a _b_ c*"


def test_slack_link_text_pipe_does_not_break_link() -> None:
    out = to_slack_mrkdwn("[a|b](http://x.y)")
    assert out.startswith("<http://x.y|a") and out.count("|") == 1


# --- Discord --------------------------------------------------------------------------------

def test_discord_keeps_markdown_and_defuses_mass_mentions() -> None:
    src = "# Head\n**bold** `code` @everyone and @here but not @herein"
    out = to_discord(src)
    assert out.startswith("# Head\n**bold** `code`")
    assert "@everyone" not in out and "@here " not in out
    assert "@\u200beveryone" in out and "@\u200bhere" in out
    assert "@herein" in out


# --- plain ----------------------------------------------------------------------------------

def test_plain_sample() -> None:
    out = to_plain(SAMPLE)
    assert out.startswith("Title with bold\n\nIntro with italic, also italic, strike, "
                          "code <b>x</b> and a link (https://example.com/a?b=1&c=2).")
    assert "Second line <b>not a tag</b> & AT&T." in out
    assert "• item one\n• item two\n  1. nested x (http://x.io)" in out
    assert "> quoted text" in out
    assert 'if a < b and c > d:\n    print("**not bold** & <tag>")' in out
    assert "```" not in out and "**" not in out.replace('"**not bold**', "")


def test_plain_links_and_unicode_urls() -> None:
    assert to_plain("<https://x.y/z>") == "https://x.y/z"
    assert to_plain("[https://x.y](https://x.y)") == "https://x.y"
    assert to_plain("[维基](https://zh.wikipedia.org/wiki/维基百科)") == \
        "维基 (https://zh.wikipedia.org/wiki/维基百科)"


def test_convert_with_plain_matches_single_functions() -> None:
    for target, fn in (("telegram", to_telegram_html), ("slack", to_slack_mrkdwn),
                       ("discord", to_discord), ("plain", to_plain)):
        assert convert_with_plain(SAMPLE, target) == (fn(SAMPLE), to_plain(SAMPLE))
    with pytest.raises(ValueError):
        convert_with_plain("x", "irc")


# --- render_chunks --------------------------------------------------------------------------

def test_render_short_reply() -> None:
    assert render_chunks("Hello **there** <you>", "telegram") == [
        RenderedChunk("Hello <b>there</b> &lt;you&gt;", "Hello there <you>",
                      "Hello **there** <you>")]
    assert render_chunks("  \n ", "slack") == []


def test_render_unknown_platform() -> None:
    with pytest.raises(ValueError, match="unknown platform"):
        render_chunks("x", "irc")


@pytest.mark.parametrize("platform,limit,length", [
    ("telegram", 4096, utf16_len), ("slack", 4000, len), ("discord", 2000, utf16_len),
    ("plain", 4000, len)])
def test_render_escaping_growth_is_resplit(platform: str, limit: int, length) -> None:
    # '&' grows 5x in Telegram/Slack; astral emoji count double in UTF-16.
    text = ("A&B<c> **x** 😀 " * 400 + "\n\n") * 4 + "```\n" + "a & b < c\n" * 600 + "```"
    chunks = render_chunks(text, platform)
    assert len(chunks) > 1
    for c in chunks:
        assert length(c.formatted) <= limit
        assert length(c.plain) <= limit
        if platform == "telegram":
            check_telegram(c.formatted)
    # nothing lost: the plain parts hold all the visible characters
    plain_all = re.sub(r"\s", "", "".join(c.plain for c in chunks))
    assert plain_all.count("😀") == 1600
    assert plain_all.count("a&b<c") == 600


def test_render_small_limit_with_heavy_escaping() -> None:
    text = "&" * 500
    chunks = render_chunks(text, "telegram", limit=50)
    assert all(utf16_len(c.formatted) <= 50 for c in chunks)
    assert "".join(c.plain for c in chunks) == text


def test_render_sources_reassemble_to_valid_markdown() -> None:
    code = "\n".join(f"line {i} <x>" for i in range(200))
    text = f"Intro **bold**.\n\n```js\n{code}\n```\n\nBye."
    chunks = render_chunks(text, "telegram", limit=500)
    rest = "\n\n".join(c.source for c in chunks[1:])
    again = render_chunks(rest, "telegram", limit=500)
    assert [c.plain for c in again] == [c.plain for c in chunks[1:]]
    for c in chunks:
        check_telegram(c.formatted)
        if "line 1" in c.plain:
            assert c.formatted.startswith('<pre><code class="language-js">')
