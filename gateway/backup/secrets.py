"""Does a YAML config text hold a literal secret (rather than ``${VAR}`` references)?

:func:`holds_literal_secret` parses the document (``yaml.safe_load``) and walks it:

- a **secret-named key** (``api_key``, ``x-api-key``, ``bot_token``, ``signing_secret``,
  ``smtp_password``, ``Authorization``, ..., in any nesting: mappings, flow mappings, list
  items, quoted keys) whose string value is anything but ``${VAR}`` references (an auth
  scheme word such as ``Bearer`` around them is fine);
- a ``${VAR:-default}`` with a non-empty default under such a key (the default *is* the
  literal);
- **a URL with a password** anywhere (``postgresql://user:hunter2@host/db``, ``?password=...``), unless the
  password is a ``${VAR}`` reference.

- a **well-known token shape** in any string value (``sk-...``, ``xoxb-...``, ``ghp_...``,
  ``AIza...``, ``Bearer ...``, ``?key=...``: the log redactor's patterns,
  ``gateway/logs/redact.py``), whatever its key (``headers: {X-Auth: sk-...}``,
  ``api_key_command: "echo sk-..."``, an MCP server's ``env``);
- **in a comment** (YAML drops them, the file keeps them): a ``key: value`` line under a
  secret-looking key whose value is one word of 8 or more characters and no ``${VAR}``
  (``# api_key: sk-live-...``), a URL with a password, or a token shape.

A text that does not parse falls back to a line heuristic (``key: value`` lines under a
secret-looking key), so a broken file with a secret is still treated as secret.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

# key names (lower case, "-" as "_") that hold secrets: a name ending in one of these
_SECRET_KEY = re.compile(r"(?:^|_)(?:api_?key|token|secret|password|passwd|pass|pat|"
                         r"authorization|private_key|access_key|credentials?)$")
_REF = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")
_SCHEMES = re.compile(r"^\s*(?:bearer|basic|token|bot)?\s*$", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"\b[a-z][\w+.-]*://[^/@\s:]*:([^@/\s]+)@|[?&]password=([^&\s]+)",
                           re.IGNORECASE)
# the fallback: `api_key: sk-...` (a value that is no ${VAR} reference) on one line
_LINE = re.compile(
    r"""^[\s\-{,]*['"]?[\w-]*(?:api[_-]?key|token|secret|password|authorization)['"]?\s*:"""
    r"""\s*(?![\s#]|\$\{[^:}]*\}|$)\S""", re.IGNORECASE | re.MULTILINE)


# in a comment: `api_key: <one word of 8+ characters, no ${VAR}>`
_COMMENT_LINE = re.compile(
    r"""(?:^|[\s\-{,])['"]?[\w-]*(?:api[_-]?key|token|secret|password|passwd|"""
    r"""authorization)['"]?\s*:\s*['"]?(?!\$\{)[^\s'"]{8,}['"]?\s*$""", re.IGNORECASE)
_COMMENT = re.compile(r"(?:^|\s)#(.*)$", re.MULTILINE)


def token_shape(value: str) -> bool:
    """True when ``value`` holds a well-known token shape (the log redactor's), not
    counting ``${VAR}`` references (``Bearer ${TOKEN}`` is none)."""
    from gateway.logs.redact import Redactor
    bare = _REF.sub("", value)
    return Redactor().redact(bare) != bare


def _comment_secret(text: str) -> bool:
    """True when a comment of the YAML ``text`` holds a secret (module docstring)."""
    for m in _COMMENT.finditer(text):
        body = m.group(1).lstrip("#")
        if _COMMENT_LINE.search(body) or url_password(body) or token_shape(body):
            return True
    return False


def _secret_key(key: Any) -> bool:
    return isinstance(key, str) and bool(_SECRET_KEY.search(key.strip().lower()
                                                            .replace("-", "_")))


def literal_value(value: str) -> bool:
    """True when ``value`` (under a secret-named key) is a literal: something besides
    ``${VAR}`` references and an auth scheme word, or a reference with a default."""
    if any(m.group(2) for m in _REF.finditer(value)):
        return True
    return not _SCHEMES.match(_REF.sub("", value))


def url_password(value: str) -> bool:
    """True when ``value`` holds a URL with a literal password (``scheme://u:pw@host``)."""
    return any(not re.fullmatch(r"\$\{\w+\}", m.group(1) or m.group(2))
               for m in _URL_PASSWORD.finditer(value))


def _walk(node: Any, secret: bool = False) -> bool:
    if isinstance(node, dict):
        return any(_walk(v, _secret_key(k)) for k, v in node.items())
    if isinstance(node, list):
        return any(_walk(v, secret) for v in node)
    if isinstance(node, str):
        return (secret and literal_value(node)) or url_password(node) or token_shape(node)
    return False


def holds_literal_secret(text: str) -> bool:
    """True when the YAML config ``text`` holds a literal secret (see the module
    docstring); a text that does not parse is judged line by line."""
    if _comment_secret(text):
        return True
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        return bool(_LINE.search(text)) or url_password(text) or token_shape(text)
    return any(_walk(d) for d in docs)
