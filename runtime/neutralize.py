"""Neutralising user text that imitates gateway metadata (DESIGN.md "Prompt layout").

Genuine runtime system events reach the model only through the gateway-generated section
of the system prompt; :func:`neutralize_user_text` makes user text that imitates that
section, or ``System:`` lines, read as quoted user text. The turn loop applies it to every
user message before it reaches the model or the transcript.
"""

from __future__ import annotations

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
