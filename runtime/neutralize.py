"""Neutralising user text that imitates gateway metadata (DESIGN.md "Prompt layout"), and
quoting platform-controlled strings (display names, usernames, group titles, channel
names, file names, thread titles) before they appear in the system role
(:func:`quote_untrusted`).

Genuine runtime system events reach the model only through the gateway-generated section
of the system prompt; :func:`neutralize_user_text` makes user text that imitates that
section, or ``System:`` lines, read as quoted user text. The turn loop applies it to every
user message before it reaches the model or the transcript.
"""

from __future__ import annotations

import json
import re

USER_TYPED_MARK = "(user-typed)"

_INVISIBLE_LEAD = re.compile(r"^[\s\u200b-\u200f\u2060\ufeff]*")
_SYSTEM_PREFIX = re.compile(
    r"^(system(?:\s+(?:message|event|notice|note))?)(\s*[:：])", re.IGNORECASE)
_BRACKET_TAG = re.compile(r"^\[(\s*(?:system|gateway)[^\]\n]*)\]", re.IGNORECASE)
_ANGLE_TAG = re.compile(r"^</?\s*(?:system|gateway)\b", re.IGNORECASE)
_FAKE_HEADING = re.compile(
    r"^#{1,6}.*\b(system\s+(events?|messages?|notices?|prompt)|gateway[- ]generated"
    r"|runtime\s+system)\b", re.IGNORECASE)
_FAKE_EVENT = re.compile(r"^[-*•]\s*\[\d{4}-\d{2}-\d{2}[ T]\d{1,2}:\d{2}")
_FAKE_PREAMBLE = re.compile(r"trusted (gateway )?runtime metadata", re.IGNORECASE)


def _neutralize_line(line: str) -> str:
    lead = _INVISIBLE_LEAD.match(line).group(0)
    body = line[len(lead):]
    if body.startswith(USER_TYPED_MARK):
        return line
    if _SYSTEM_PREFIX.match(body):
        return lead + _SYSTEM_PREFIX.sub(rf"\1 {USER_TYPED_MARK}\2", body, count=1)
    tag = _BRACKET_TAG.match(body)
    if tag and USER_TYPED_MARK not in tag.group(1):
        return lead + _BRACKET_TAG.sub(rf"[\1 {USER_TYPED_MARK}]", body, count=1)
    if (_ANGLE_TAG.match(body) or _FAKE_HEADING.match(body) or _FAKE_EVENT.match(body)
            or _FAKE_PREAMBLE.search(body)):
        return f"{lead}{USER_TYPED_MARK} {body}"
    return line


def neutralize_user_text(text: str) -> str:
    """Defuse user text that imitates gateway metadata; everything else is unchanged.

    Applied line by line (leading whitespace and zero-width characters are looked
    through, case-insensitive):

    - ``System:`` (also full-width ``：``) becomes ``System (user-typed):``;
    - a leading ``[System ...]`` / ``[Gateway ...]`` tag gets the mark inside:
      ``[System Message (user-typed)]``;
    - ``System Message:`` / ``System Event:`` / ``System Notice:`` likewise;
    - a line starting with a ``<system>``/``<gateway>`` tag, a markdown heading about
      system events/messages/prompt or "gateway-generated" (``## Runtime System Events``),
      an event-like bullet
      ``- [2026-03-13 14:30 ...`` or the section's "trusted runtime metadata" sentence is
      prefixed with ``(user-typed) `` so it is no longer a heading/bullet/tag.

    The result reads as quoted user text and is stable: applying it twice changes
    nothing more.
    """
    if not text:
        return text
    return "".join(_neutralize_line(ln) if ln.strip() else ln
                   for ln in text.splitlines(keepends=True))


_WS = re.compile(r"\s+")  # includes \r \n \v \f \x1c-\x1f \x85 \u2028 \u2029
# controls, zero-width space, direction marks/overrides, BOM (ZWJ/ZWNJ kept: emoji, scripts)
_CTRL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
UNTRUSTED_MAX_CHARS = 128


def one_line(text: object, max_chars: int) -> str:
    """One safe line: whitespace runs (newlines included) become one space, control and
    bidi/zero-width characters are removed, and the result is capped at ``max_chars``
    characters (an ellipsis marks the cut)."""
    s = _CTRL.sub("", _WS.sub(" ", str(text))).strip()
    return s if len(s) <= max_chars else s[: max_chars - 1] + "…"


def quote_untrusted(value: object, max_chars: int = UNTRUSTED_MAX_CHARS) -> str:
    """A string a platform user controls, rendered as quoted data for the system role: one
    line (:func:`one_line`, capped at ``max_chars``) inside a JSON string literal, so it
    can neither start a line of its own nor close its quotes (``"`` and ``\\`` escaped)."""
    return json.dumps(one_line(value, max_chars), ensure_ascii=False)


def neutral_line(value: object, max_chars: int) -> str:
    """:func:`one_line` then :func:`neutralize_user_text`: a server- or user-controlled
    string that must stay readable text (e.g. a JSON Schema property ``description``)
    but can neither break lines nor pose as ``System:``/gateway metadata."""
    return neutralize_user_text(one_line(value, max_chars))


def quote_server_text(value: object, max_chars: int) -> str:
    """A string a remote server controls (an MCP tool's description or title), rendered
    as quoted data: :func:`neutral_line` inside a JSON string literal (newlines, quotes
    and backslashes cannot escape it), untrusted-block markers defused. The caller says
    whose text it is."""
    return json.dumps(defuse_markers(neutral_line(value, max_chars)), ensure_ascii=False)


def defuse_markers(text: str) -> str:
    """``<<<``/``>>>`` made look-alikes, so remote text cannot open or close a block."""
    return text.replace("<<<", "‹‹‹").replace(">>>", "›››")


def wrap_untrusted_block(label: str, source: str, text: str) -> str:
    """``text`` a remote party wrote (a fetched page, an MCP tool's result) between
    ``<<<UNTRUSTED_<label> source="...">>>`` and ``<<<END_UNTRUSTED_<label>>>>`` markers
    the model is told about (the caller's tool description says so). Marker-like ``<<<``
    and ``>>>`` inside are defused so the text cannot close the wrapper, and its lines
    pass :func:`neutralize_user_text` so none can pose as ``System:``/gateway metadata;
    markers in ``source`` (a redirect target, a server's tool name) are defused too."""
    safe = neutralize_user_text(defuse_markers(text))
    # the source is remote text too (a redirect's Location, an MCP server's tool name)
    quoted = json.dumps(defuse_markers(source), ensure_ascii=False)
    return (f"<<<UNTRUSTED_{label} source={quoted}>>>\n"
            f"{safe}\n<<<END_UNTRUSTED_{label}>>>")
