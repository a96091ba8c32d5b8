"""Split model Markdown into chunks that fit a platform's message limit.

Used by every adapter before formatting (DESIGN.md "The path of one message", step 8:
"split to the platform's limits"). Break preference, best first: paragraph (blank line or
the edge of a fenced code block), line, sentence (``. ``, ``! ``, ``? ``, ``。！？``), word
(space), hard cut. A hard cut never splits a code point or a UTF-16 surrogate pair and backs
off from the inside of a grapheme cluster (combining marks, variation selectors, ZWJ emoji
sequences, skin tones, flags, keycaps) when the cluster is short.

A fenced code block that must be split is closed at the end of the chunk and reopened with
the same opening line (same info string) at the start of the next; those added fence lines
count toward the limit. Fences are found at any indentation (inside list items too). A
chunk that starts at or inside an indented fence gets it at column 0, its lines dedented by
up to the fence's indentation (as CommonMark renders them), so the code keeps its own
indentation and every chunk's fences balance. Every chunk has content besides fence lines.

Platform limits: Telegram 4096 UTF-16 code units (Bot API ``sendMessage``), Discord 2000
characters (``content``), Slack 4000 characters (``chat.postMessage`` recommends <= 4000).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

TELEGRAM_LIMIT = 4096
DISCORD_LIMIT = 2000
SLACK_LIMIT = 4000

Length = Callable[[str], int]

# Break priorities: higher is preferred.
_HARD, _WORD, _SENTENCE, _LINE, _PARAGRAPH = range(5)

_FENCE_OPEN = re.compile(r"^([ \t]*)(`{3,}|~{3,})([^\n]*)$", re.MULTILINE)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_SENTENCE_END = re.compile(r"[.!?](?=[ \t])|[。！？]")
_SPACES = re.compile(r"[ \t]+")
_ZWJ = "\u200d"


def utf16_len(s: str) -> int:
    """Length of ``s`` in UTF-16 code units (astral characters count 2), as Telegram counts."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


@dataclass(frozen=True, slots=True)
class _Fence:
    open_start: int  # start of the opening fence line
    body_start: int  # first character after the opening line's newline
    close_start: int  # start of the closing fence line (len(text) when unclosed)
    end: int  # end of the closing fence line (excluding its newline)
    opener: str  # the opening line, e.g. "```python"
    closer: str  # what closes it, e.g. "```"
    indent: int = 0  # blanks before the opening fence


@dataclass(frozen=True, slots=True)
class _Cut:
    cut: int  # chunk content is text[pos:cut]
    resume: int  # next chunk starts here
    fence: _Fence | None  # set when cut lies inside this fence's body


def _find_fences(text: str) -> list[_Fence]:
    """Fenced code blocks per CommonMark: closed by a line of the same character at least as
    long as the opener, with no info string; an unclosed fence runs to the end."""
    fences: list[_Fence] = []
    pos = 0
    while True:
        m = _FENCE_OPEN.search(text, pos)
        if m is None:
            return fences
        indent, marker, info = m.group(1), m.group(2), m.group(3)
        if marker[0] == "`" and "`" in info:  # not a fence: an inline code span
            pos = m.end() + 1
            continue
        body_start = min(m.end() + 1, len(text))
        close_re = re.compile(
            r"^[ \t]*" + re.escape(marker[0]) + "{" + str(len(marker)) + r",}[ \t]*$",
            re.MULTILINE)
        c = close_re.search(text, body_start)
        width = len(indent)
        if c is None:
            fences.append(_Fence(m.start(), body_start, len(text), len(text),
                                 m.group(0), indent + marker, width))
            return fences
        fences.append(_Fence(m.start(), body_start, c.start(), c.end(),
                             m.group(0), indent + marker, width))
        pos = c.end()


def _in_cluster(text: str, i: int) -> bool:
    """True when a cut between text[i-1] and text[i] would split a grapheme cluster."""
    if i <= 0 or i >= len(text):
        return False
    prev, cur = text[i - 1], text[i]
    o = ord(cur)
    if "\udc00" <= cur <= "\udfff" and "\ud800" <= prev <= "\udbff":
        return True  # surrogate pair kept by "surrogatepass" decoding
    if cur == _ZWJ or prev == _ZWJ:
        return True
    if 0xFE00 <= o <= 0xFE0F or 0xE0100 <= o <= 0xE01EF:  # variation selectors
        return True
    if 0x1F3FB <= o <= 0x1F3FF or 0xE0020 <= o <= 0xE007F or o == 0x20E3:
        return True  # skin tone, tag sequence (subdivision flags), keycap
    if unicodedata.combining(cur) or unicodedata.category(cur) in ("Mn", "Mc", "Me"):
        return True
    if 0x1F1E6 <= o <= 0x1F1FF:  # regional indicators pair up into flags
        run = 0
        j = i - 1
        while j >= 0 and 0x1F1E6 <= ord(text[j]) <= 0x1F1FF:
            run += 1
            j -= 1
        return run % 2 == 1
    return False


def _safe_cut(text: str, i: int, floor: int) -> int:
    """Move a hard cut back out of a grapheme cluster (at most 32 code points); if the cluster
    is longer than that, fall back to a code point boundary outside a surrogate pair."""
    j = i
    while j > floor and _in_cluster(text, j) and i - j < 32:
        j -= 1
    if j > floor and not _in_cluster(text, j):
        return j
    j = i
    if (0 < j < len(text) and "\udc00" <= text[j] <= "\udfff"
            and "\ud800" <= text[j - 1] <= "\udbff"):
        j -= 1
    return j


def _max_fit(text: str, pos: int, head: str, limit: int, length: Length) -> int:
    """Largest ``e`` with ``length(head + text[pos:e]) <= limit`` (``length`` is assumed
    monotone in the prefix). Gallops, then bisects, so cost stays ~O(limit log limit)."""
    n = len(text)
    lo, step = pos, max(1, limit)
    hi = min(n, pos + step)
    while length(head + text[pos:hi]) <= limit:
        if hi == n:
            return n
        lo, step = hi, step * 2
        hi = min(n, pos + step)
    while hi - lo > 1:  # invariant: lo fits, hi does not
        mid = (lo + hi) // 2
        if length(head + text[pos:mid]) <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def _fence_at(fences: list[_Fence], i: int) -> _Fence | None:
    """The fence whose body contains position ``i`` (cuts at the close line count as body)."""
    for f in fences:
        if f.body_start <= i < f.close_start or (i == f.close_start and f.close_start < f.end):
            return f
        if f.open_start > i:
            break
    return None


def _in_fence_line(fences: list[_Fence], i: int) -> bool:
    """True inside an opening or closing fence line (a cut there would break the fence)."""
    for f in fences:
        if f.open_start < i < f.body_start or f.close_start < i < f.end:
            return True
    return False


def _candidates(text: str, pos: int, hi: int, fences: list[_Fence]) -> list[list[_Cut]]:
    """Break points in (pos, hi], grouped by priority (index = priority)."""
    tiers: list[list[_Cut]] = [[] for _ in range(5)]
    window = text[pos:hi + 80]  # look past hi: a separator may start right at the cut

    def add(prio: int, cut: int, resume: int) -> None:
        if cut <= pos or cut > hi or _in_fence_line(fences, cut):
            return
        tiers[prio].append(_Cut(cut, resume, _fence_at(fences, cut)))

    for f in fences:
        if f.open_start > hi:
            break
        add(_PARAGRAPH, f.open_start, f.open_start)
        if f.close_start < f.end:
            add(_PARAGRAPH, f.end, f.end)
    for m in _BLANK_LINE.finditer(window):
        if _fence_at(fences, pos + m.start()) is None:
            add(_PARAGRAPH, pos + m.start(), pos + m.end())
    for m in re.finditer("\n", window):
        i = pos + m.start()
        f = _fence_at(fences, i)
        if f is not None and (i + 1 >= f.close_start or i <= max(f.body_start, pos)):
            continue  # never leave an empty code block on either side
        add(_LINE, i, i + 1)
    for m in _SENTENCE_END.finditer(window):
        i = pos + m.end()
        if _fence_at(fences, i) is None:
            s = _SPACES.match(text, i)
            add(_SENTENCE, i, s.end() if s else i)
    for m in _SPACES.finditer(window):
        i = pos + m.start()
        if _fence_at(fences, i) is not None and not text[text.rfind("\n", 0, i) + 1:i].strip():
            continue  # a code line's indentation is not a word break
        add(_WORD, i, pos + m.end())
    return tiers


def _dedent(segment: str, width: int) -> str:
    """Remove up to ``width`` leading blanks from every line of ``segment``."""
    return re.sub(rf"^[ \t]{{1,{width}}}", "", segment, flags=re.MULTILINE)


def _body(text: str, pos: int, end: int, fences: list[_Fence]) -> str:
    """``text[pos:end]``; a fence the chunk starts at or inside is dedented (column 0)."""
    f = _fence_at(fences, pos) or next((x for x in fences if x.open_start == pos), None)
    if f is None or f.indent == 0 or pos >= f.end:
        return text[pos:end]
    stop = min(end, f.end)
    return _dedent(text[pos:stop], f.indent) + text[stop:end]


def _closer(pos: int, fence: _Fence) -> str:
    # The chunk holds the fence's opener (and its context) only when it starts before it.
    return fence.closer if pos < fence.open_start else fence.closer.lstrip()


def _assemble(text: str, pos: int, head: str, cut: _Cut, fences: list[_Fence]) -> str:
    body = _body(text, pos, cut.cut, fences).rstrip()
    if cut.fence is not None:
        body += "\n" + _closer(pos, cut.fence)
    return head + body


def _holds_content(text: str, start: int, end: int, fences: list[_Fence]) -> bool:
    """True when ``text[start:end]`` holds something besides whitespace and the source's
    own fence lines. Judged on the source, not on the chunk: a reopened or added fence line
    is not content, while a line inside a block that only looks like a fence
    (```` ```py ```` in an unclosed block, or at the end of a prose line) is."""
    i = start
    for f in fences:
        for a, b in ((f.open_start, f.body_start), (f.close_start, f.end)):
            if b <= i or a >= end:
                continue
            if text[i:a].strip():
                return True
            i = max(i, b)
    return bool(text[i:end].strip())


def _skip_blank(text: str, pos: int) -> int:
    """Skip whitespace-only lines (keep the indentation of the first real line)."""
    n = len(text)
    while pos < n:
        nl = text.find("\n", pos)
        line_end = n if nl < 0 else nl
        if text[pos:line_end].strip():
            return pos
        pos = line_end + 1
    return n


def split_text(text: str, limit: int, *, length: Length = len) -> list[str]:
    """Split Markdown ``text`` into chunks with ``length(chunk) <= limit``.

    ``length`` measures a chunk (``len`` = code points; ``utf16_len`` for Telegram). Returns
    [] for empty/whitespace text. Chunks are stripped of leading/trailing blank lines;
    indentation inside code is kept. Raises ValueError when ``limit < 1`` or a single code
    point does not fit.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        return []
    fences = _find_fences(text)
    chunks: list[str] = []
    pos = _skip_blank(text, 0)
    head = ""  # the reopened fence line when pos is inside a split code block
    n = len(text)
    while pos < n:
        start = pos
        chunk, pos, reopen, cut = _next_chunk(text, pos, head, limit, length, fences)
        if _holds_content(text, start, cut, fences):
            chunks.append(chunk)
        pos = _skip_blank(text, pos)
        head = ""
        if reopen is not None and pos < n:
            if pos >= reopen.close_start:  # nothing but the closing line left
                pos = _skip_blank(text, min(n, reopen.end + 1))
            else:
                head = reopen.opener.lstrip() + "\n"
    return chunks


def _next_chunk(text: str, pos: int, head: str, limit: int, length: Length,
                fences: list[_Fence]) -> tuple[str, int, _Fence | None, int]:
    """One chunk starting at ``pos``: (chunk, resume position, fence to reopen or None,
    end of the chunk's content in ``text``)."""
    n = len(text)
    hi = _max_fit(text, pos, head, limit, length)
    rest = head + _body(text, pos, n, fences).rstrip()
    if hi == n or length(rest) <= limit:  # (dedenting may make the rest fit)
        return rest, n, None, n
    tiers = _candidates(text, pos, hi, fences)
    for prio in (_PARAGRAPH, _LINE, _SENTENCE, _WORD):
        for cut in reversed(tiers[prio]):  # the last break in the window of this kind
            chunk = _assemble(text, pos, head, cut, fences)
            if length(chunk) <= limit and _holds_content(text, pos, cut.cut, fences):
                return chunk, cut.resume, cut.fence, cut.cut
    # Hard cut: inside code keep the fence wrapping if there is room for it.
    f = _fence_at(fences, hi) or _fence_at(fences, pos)  # (hi may sit in the close line)
    if f is not None:
        reserve = head + "\n" + f.closer
        hi2 = _max_fit(text, pos, reserve, limit, length)
        c = _safe_cut(text, min(hi2, max(f.body_start, f.close_start - 1)), pos)
        if c > max(pos, f.body_start) and not _in_fence_line(fences, c):
            chunk = _assemble(text, pos, head, _Cut(c, c, f), fences)
            if _holds_content(text, pos, c, fences):
                return chunk, c, f, c
    plain_hi = _max_fit(text, pos, "", limit, length)
    c = _safe_cut(text, plain_hi, pos)
    if c <= pos:
        raise ValueError(f"limit {limit} is too small for the character at offset {pos}")
    return text[pos:c], c, None, c
