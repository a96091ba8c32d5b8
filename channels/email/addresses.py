"""Email addresses as the email channel compares them: one canonical form, used both for
``allow_from`` entries at config load (channels/email/config.py) and for the sender of
every mail (channels/email/parse.py), so an entry that loads is one that can match.

The canonical form is the bare address, lower-cased: ``Alice <Alice@Example.org>``,
``<alice@example.org>`` and ``ALICE@example.org`` are all ``alice@example.org`` (the local
part is compared case-insensitively, as every mail provider does in practice).
"""

from __future__ import annotations

import re

_NAMED = re.compile(r"(?:[^<>]*?)<([^<>]*)>")  # Name <addr> or <addr>
_BAD = re.compile(r"[\s<>()\[\],;:\\\"]")  # never in a bare address or domain
_CHANNEL_PREFIX = "email:"


def canonical(address: str) -> str:
    """The bare, lower-cased address of ``address`` (``Name <a@x>`` and ``<a@x>`` unwrapped,
    surrounding space dropped). No validation: see :func:`allow_entry`."""
    text = address.strip()
    named = _NAMED.fullmatch(text)
    if named:
        text = named.group(1).strip()
    return text.lower()


def allow_entry(entry: str) -> str:
    """One ``allow_from`` entry in canonical form: ``*``, an address (``alice@example.org``)
    or a whole domain (``@example.org``, also written ``*@example.org``); the ``email:``
    channel prefix is dropped.

    Raises ValueError naming the entry and why it could never match: a ``mailto:`` link,
    or not exactly one ``@`` with something on both sides (only a domain may start with
    ``@``), or a character no bare address has."""
    text = entry.strip()
    if text == "*":
        return text
    if text.lower().startswith(_CHANNEL_PREFIX):
        text = text[len(_CHANNEL_PREFIX):]
    if text.lower().startswith("mailto:"):
        raise ValueError(f"{entry!r}: a mailto: link; write the address alone "
                         f"({canonical(text[7:])!r})")
    value = canonical(text)
    local, _, domain = value.partition("@")
    if local == "*":  # the usual wildcard spelling of a whole domain
        local, value = "", f"@{domain}"
    if value.count("@") != 1 or not domain or domain.startswith(".") \
            or domain.endswith(".") or "*" in value or _BAD.search(value):
        raise ValueError(f"{entry!r}: not an address (alice@example.org), a domain "
                         "(@example.org or *@example.org) or *: it needs exactly one @, "
                         "no other wildcard and no trailing dot")
    return value if local else f"@{domain}"
