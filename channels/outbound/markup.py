"""Convert model Markdown to each platform's markup.

Models write CommonMark-ish Markdown (``**bold**``, ``*italic*``/``_italic_``, ``~~strike~~``,
inline code, fenced code, ``[text](url)``, headings, lists, quotes, tables). We parse it with
markdown-it-py (CommonMark + strikethrough + tables, raw HTML disabled so ``<b>`` typed by a
model or user is text) and render the syntax tree, so tags are balanced by construction and
text inside code is escaped but never formatted.

Targets:

- ``to_telegram_html``: Bot API "HTML style" (core.telegram.org/bots/api#html-style): tags
  b, i, s, code, pre, ``<pre><code class="language-x">``, ``a href``, blockquote; ``<``,
  ``>``, ``&`` escaped everywhere, ``"`` too in href.
- ``to_slack_mrkdwn``: Slack mrkdwn (api.slack.com/reference/surfaces/formatting): ``*b*``,
  ``_i_``, ``~s~``, ``<url|text>``; escape ``&``, ``<``, ``>``.
- ``to_discord``: Discord speaks Markdown; we keep the source and only defuse
  ``@everyone``/``@here`` with a zero-width space.
- ``to_matrix_html``: the HTML of Matrix's ``formatted_body`` (``org.matrix.custom.html``),
  markdown-it's own HTML renderer (raw HTML escaped); ``@room`` defused like Discord's
  mass mentions.
- ``to_plain``: markup stripped, links as ``text (url)``; the fallback when a platform
  rejects the formatted text.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # markdown-it is loaded by the first reply that is rendered
    from markdown_it.tree import SyntaxTreeNode

BULLET = "\u2022"  # •
_HR = "\u2014\u2014\u2014"  # ———
_ZWSP = "\u200b"
_MASS_MENTION = re.compile(r"@(everyone|here)\b")
_ROOM_MENTION = re.compile(r"@room\b")
_LANG_SAFE = re.compile(r"[^A-Za-z0-9_+#.-]")


@dataclass(frozen=True, slots=True)
class _Dialect:
    """How one target renders each construct (inputs are already rendered/escaped
    unless named ``raw``)."""

    escape: Callable[[str], str]
    bold: Callable[[str], str]
    italic: Callable[[str], str]
    strike: Callable[[str], str]
    code: Callable[[str], str]  # raw code span text
    link: Callable[[str, str, str], str]  # (rendered text, raw href, raw plain text)
    fence: Callable[[str, str], str]  # (raw code, raw language)
    heading: Callable[[str], str]
    quote: Callable[[str], str]  # rendered block content


@functools.cache
def _parser():
    from markdown_it import MarkdownIt
    return MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(
        ["strikethrough", "table"])


def _tree(md: str) -> SyntaxTreeNode:
    from markdown_it.tree import SyntaxTreeNode
    return SyntaxTreeNode(_parser().parse(md))


# --- Telegram HTML --------------------------------------------------------------------------

def _tg_escape(s: str) -> str:
    return html.escape(s, quote=False)


def _tg_link(text: str, href: str, plain: str) -> str:
    return f'<a href="{html.escape(href, quote=True)}">{text or _tg_escape(href)}</a>'


def _tg_fence(code: str, lang: str) -> str:
    body = _tg_escape(code.rstrip("\n"))
    lang = _LANG_SAFE.sub("", lang)
    if lang:
        return f'<pre><code class="language-{lang}">{body}</code></pre>'
    return f"<pre>{body}</pre>"


_TELEGRAM = _Dialect(
    escape=_tg_escape,
    bold=lambda s: f"<b>{s}</b>",
    italic=lambda s: f"<i>{s}</i>",
    strike=lambda s: f"<s>{s}</s>",
    code=lambda raw: f"<code>{_tg_escape(raw)}</code>",
    link=_tg_link,
    fence=_tg_fence,
    heading=lambda s: f"<b>{s}</b>",
    quote=lambda s: f"<blockquote>{s}</blockquote>",
)

# --- Slack mrkdwn ---------------------------------------------------------------------------


def _slack_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_link(text: str, href: str, plain: str) -> str:
    url = _slack_escape(href)
    label = _slack_escape(plain).replace("|", "\u2223")  # a pipe would end the url part
    if not plain or plain == href or "mailto:" + plain == href:
        return f"<{url}>"
    return f"<{url}|{label}>"


def _slack_wrap(mark: str) -> Callable[[str], str]:
    # Slack needs the markers next to non-space characters: move spaces outside them.
    def wrap(s: str) -> str:
        core = s.strip()
        if not core:
            return s
        lead = s[: len(s) - len(s.lstrip())]
        trail = s[len(s.rstrip()):]
        return f"{lead}{mark}{core}{mark}{trail}"
    return wrap


_SLACK = _Dialect(
    escape=_slack_escape,
    bold=_slack_wrap("*"),
    italic=_slack_wrap("_"),
    strike=_slack_wrap("~"),
    code=lambda raw: f"`{_slack_escape(raw)}`",
    link=_slack_link,
    fence=lambda raw, lang: f"```\n{_slack_escape(raw.rstrip(chr(10)))}\n```",
    heading=_slack_wrap("*"),
    quote=lambda s: "\n".join("> " + line if line else ">" for line in s.split("\n")),
)

# --- plain text -----------------------------------------------------------------------------


_PCT_HIGH = re.compile(r"(?:%[89A-Fa-f][0-9A-Fa-f])+")


def _readable_url(href: str) -> str:
    """Undo the parser's percent-encoding of non-ASCII (UTF-8) only; ASCII escapes such as
    ``%20`` stay, so the URL remains one clickable word."""
    def dec(m: re.Match[str]) -> str:
        try:
            return bytes.fromhex(m.group(0).replace("%", "")).decode("utf-8")
        except UnicodeDecodeError:
            return m.group(0)
    return _PCT_HIGH.sub(dec, href)


def _plain_link(text: str, href: str, plain: str) -> str:
    href = _readable_url(href)
    if not plain or plain == href or "mailto:" + plain == href:
        return href if not plain else plain
    return f"{text} ({href})"


_PLAIN = _Dialect(
    escape=lambda s: s,
    bold=lambda s: s,
    italic=lambda s: s,
    strike=lambda s: s,
    code=lambda raw: raw,
    link=_plain_link,
    fence=lambda raw, lang: raw.rstrip("\n"),
    heading=lambda s: s,
    quote=lambda s: "\n".join("> " + line if line else ">" for line in s.split("\n")),
)

# WhatsApp: *bold*, _italic_, ~strike~, `code`, ```blocks```, "> " quotes; no escaping
# exists, links stay readable text (WhatsApp links bare URLs itself).
_WHATSAPP = _Dialect(
    escape=lambda s: s,
    bold=_slack_wrap("*"),
    italic=_slack_wrap("_"),
    strike=_slack_wrap("~"),
    code=lambda raw: f"`{raw}`",
    link=_plain_link,
    fence=lambda raw, lang: f"```{raw.rstrip(chr(10))}```",
    heading=_slack_wrap("*"),
    quote=lambda s: "\n".join("> " + line if line else ">" for line in s.split("\n")),
)

# --- tree rendering -------------------------------------------------------------------------


def _plain_text(node: SyntaxTreeNode) -> str:
    """The visible text of an inline subtree, unformatted (for link labels, tables)."""
    if node.type in ("text", "code_inline"):
        return node.content
    if node.type in ("softbreak", "hardbreak"):
        return "\n"
    return "".join(_plain_text(c) for c in node.children)


def _inline(node: SyntaxTreeNode, d: _Dialect, bold: bool = False) -> str:
    """Render inline children. ``bold`` suppresses nested bold (headings are bold already;
    Slack would break on ``*a *b* c*``)."""
    out: list[str] = []
    for c in node.children:
        t = c.type
        if t == "text":
            out.append(d.escape(c.content))
        elif t in ("softbreak", "hardbreak"):
            out.append("\n")
        elif t == "code_inline":
            out.append(d.code(c.content))
        elif t == "strong":
            inner = _inline(c, d, True)
            out.append(inner if bold else d.bold(inner))
        elif t == "em":
            out.append(d.italic(_inline(c, d, bold)))
        elif t == "s":
            out.append(d.strike(_inline(c, d, bold)))
        elif t == "link":
            out.append(d.link(_inline(c, d, bold), str(c.attrs.get("href", "")), _plain_text(c)))
        elif t == "image":
            alt = _plain_text(c)
            src = str(c.attrs.get("src", ""))
            out.append(d.link(d.escape(alt), src, alt))
        else:  # unknown inline node: keep its text, escaped
            out.append(d.escape(_plain_text(c)))
    return "".join(out)


def _table(node: SyntaxTreeNode) -> str:
    """A table as aligned plain-text rows (no chat platform renders Markdown tables)."""
    rows: list[list[str]] = []
    for section in node.children:
        for tr in section.children:
            rows.append([" ".join(_plain_text(cell).split()) for cell in tr.children])
    if not rows:
        return ""
    ncol = max(len(r) for r in rows)
    widths = [max((len(r[i]) if i < len(r) else 0) for r in rows) for i in range(ncol)]
    lines = [" | ".join((r[i] if i < len(r) else "").ljust(widths[i])
                        for i in range(ncol)).rstrip() for r in rows]
    if len(lines) > 1:
        lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _block(c: SyntaxTreeNode, d: _Dialect, depth: int, quoted: bool) -> str:
    """Render one block node. ``depth`` = list nesting; ``quoted`` = inside a quote (Telegram
    rejects nested blockquote entities, so inner quotes are not wrapped again)."""
    t = c.type
    if t == "paragraph":
        return _inline(c.children[0], d) if c.children else ""
    if t == "heading":
        return d.heading(_inline(c.children[0], d, True)) if c.children else ""
    if t in ("fence", "code_block"):
        lang = (c.info or "").split()[0] if t == "fence" and c.info.strip() else ""
        return d.fence(c.content, lang)
    if t in ("bullet_list", "ordered_list"):
        return _list(c, d, depth, quoted)
    if t == "blockquote":
        inner = _blocks(c, d, depth, "\n", True)
        return inner if quoted and d is _TELEGRAM else d.quote(inner)
    if t == "hr":
        return _HR
    if t == "table":
        return d.fence(_table(c), "")
    if t == "inline":
        return _inline(c, d)
    return d.escape(c.content or "")


def _blocks(node: SyntaxTreeNode, d: _Dialect, depth: int = 0, sep: str = "\n\n",
            quoted: bool = False) -> str:
    parts = (_block(c, d, depth, quoted) for c in node.children)
    return sep.join(p for p in parts if p)


def _list(node: SyntaxTreeNode, d: _Dialect, depth: int, quoted: bool) -> str:
    lines: list[str] = []
    indent = "  " * depth
    start = int(node.attrs.get("start", 1) or 1) if node.type == "ordered_list" else 1
    for i, item in enumerate(node.children):
        marker = f"{start + i}." if node.type == "ordered_list" else BULLET
        head, rest = "", []
        for j, child in enumerate(item.children):
            if j == 0 and child.type == "paragraph":
                head = _block(child, d, depth, quoted).replace("\n", "\n" + indent + "  ")
            elif child.type in ("bullet_list", "ordered_list"):
                rest.append(_list(child, d, depth + 1, quoted))
            else:
                body = _block(child, d, depth + 1, quoted)
                rest.append(indent + "  " + body.replace("\n", "\n" + indent + "  "))
        lines.append(f"{indent}{marker} {head}".rstrip())
        lines.extend(r for r in rest if r.strip())
    return "\n".join(lines)


def _render(md: str, d: _Dialect) -> str:
    return _blocks(_tree(md), d).strip("\n")


_DIALECTS = {"telegram": _TELEGRAM, "slack": _SLACK, "whatsapp": _WHATSAPP, "plain": _PLAIN}


def convert_with_plain(md: str, target: str) -> tuple[str, str]:
    """``(formatted, plain)`` for ``target`` ("telegram", "slack", "discord", "whatsapp", "matrix" or
    "plain"),
    parsing the Markdown once (markdown-it-py costs ~1.5 ms per KB). Raises ValueError for
    an unknown target."""
    if target == "discord":
        return to_discord(md), to_plain(md)
    if target == "matrix":
        return to_matrix_html(md), _ROOM_MENTION.sub("@" + _ZWSP + "room", to_plain(md))
    d = _DIALECTS.get(target)
    if d is None:
        raise ValueError(f"unknown markup target {target!r}")
    tree = _tree(md)
    plain = _blocks(tree, _PLAIN).strip("\n")
    return (plain if d is _PLAIN else _blocks(tree, d).strip("\n")), plain


def to_telegram_html(md: str) -> str:
    """Model Markdown -> Telegram Bot API HTML (``parse_mode="HTML"``).

    Headings become bold lines, list items ``• `` / ``1. `` lines, tables a ``<pre>`` block;
    every tag is balanced. Returns "" for empty input.
    """
    return _render(md, _TELEGRAM)


def to_slack_mrkdwn(md: str) -> str:
    """Model Markdown -> Slack mrkdwn (``*b*``, ``_i_``, ``~s~``, ``<url|text>``, fences kept
    without the language; ``&<>`` escaped so a model cannot forge ``<!channel>`` mentions)."""
    return _render(md, _SLACK)


def to_discord(md: str) -> str:
    """Model Markdown -> Discord message content: the Markdown as written (headings, tables
    and all), with ``@everyone``/``@here`` defused by a zero-width space after the ``@``.
    Adapters should still send ``allowed_mentions`` that forbid mass mentions."""
    return _MASS_MENTION.sub("@" + _ZWSP + r"\1", md.strip("\n"))


def to_matrix_html(md: str) -> str:
    """Model Markdown -> Matrix ``formatted_body`` HTML (CommonMark + strikethrough +
    tables as markdown-it renders them; ``<`` typed in the text is escaped, so no raw
    HTML reaches the room). ``@room`` gets a zero-width space after the ``@``."""
    out = _parser().render(md).strip("\n")
    return _ROOM_MENTION.sub("@" + _ZWSP + "room", out)


def to_plain(md: str) -> str:
    """Model Markdown -> plain text: markup stripped, links as ``text (url)``, lists as
    ``• `` lines, code as its raw text, quotes as ``> `` lines."""
    return _render(md, _PLAIN)
