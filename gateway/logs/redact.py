"""Secret redaction for logs: configured secrets and well-known token shapes become
``***`` wherever they would appear (handbook "Security": secrets never reach logs)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any

REDACTED = "***"
MIN_SECRET_LEN = 6

# Token shapes redacted even when nobody configured them: (gate substrings, gate regex or
# None, pattern). A family's pattern runs only when one of its gate substrings is in the
# string (and its gate regex, a literal-prefixed one, finds something): sre scans an
# alternation at ~10 ns a character while `in` is C-speed, so the usual clean string costs
# ~1 us. Prefix groups (k) are kept so the line says what was hidden ("Bearer ***").
_T = r"[A-Za-z0-9_\-]"
_FAMILIES: tuple[tuple[tuple[str, ...], re.Pattern[str] | None, re.Pattern[str]], ...] = (
    # OpenAI / Anthropic keys: sk-..., sk-proj-..., sk-ant-...
    (("sk-",), None, re.compile(r"(?<![A-Za-z0-9])sk-(?:ant-|proj-)?" + _T + "{16,}")),
    # Slack bot / user / app tokens
    (("xox", "xapp-"), None,
     re.compile(r"(?<![A-Za-z0-9])(?:xox[abposr]|xapp)-[A-Za-z0-9\-]{8,}")),
    # Telegram bot token <bot id>:<35 chars>, also inside https://.../bot<token>/getMe
    ((":",), re.compile(":" + _T + "{30}"), re.compile(r"(?<!\d)\d{6,}:" + _T + "{30,}")),
    # Discord bot token <base64 id>.<6>.<27+>
    ((".",), re.compile(r"\." + _T + r"{6}\."),
     re.compile(r"(?<![A-Za-z0-9_.\-])" + _T + r"{24,}\." + _T + r"{6}\." + _T + "{27,}")),
    # GitHub tokens (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_) and Google API keys (AIza)
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "AIza"), None,
     re.compile(r"(?<![A-Za-z0-9])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
                r"|AIza[0-9A-Za-z_\-]{30,})")),
    # Authorization header value (Bearer / Basic / Bot / raw), repr'd dicts included
    (("uthorization", "UTHORIZATION"), None,
     re.compile(r"(?P<k>(?:Authorization|authorization|AUTHORIZATION)[\"']?\s*[:=]\s*[\"']?"
                r"(?:(?i:bearer|basic|bot|token)\s+)?)[^\s\"',;}\]]+")),
    (("earer", "EARER"), None,
     re.compile(r"(?P<k>(?:Bearer|bearer|BEARER)\s+)[A-Za-z0-9._~+/=\-]{6,}")),
    # The password of a URL's userinfo: scheme://user:PASSWORD@host (OTLP endpoints, DSNs)
    (("://",), re.compile(r"://[^/\s@]*:[^/\s@]*@"),
     re.compile(r"(?P<k>\b[A-Za-z][A-Za-z0-9+.\-]*://[^/@\s:]*:)"
                r"(?!(?:password|\*+|\$\{\w+\})@)[^@/\s]+(?=@)")),  # not a placeholder
    # Credentials in query strings / key=value text: ?api_key=..., &token=...
    (("=",), None,
     re.compile(r"(?P<k>(?<![A-Za-z0-9_])(?i:api[_-]?key|access[_-]?token|auth[_-]?token"
                r"|client[_-]?secret|secret|password|token|key)=)[^&\s\"'#<>]+")),
)
# Shortest string any pattern can match ("key=x"); shorter strings skip everything.
_FAST_PATH_LEN = 5


def _replace(m: re.Match[str]) -> str:
    return (m.group("k") if m.lastgroup == "k" else "") + REDACTED


@dataclass
class Redactor:
    """Replaces configured secrets and well-known token shapes with ``***``.

    Configured secrets (longest first) are one precompiled alternation; token shapes are a
    few precompiled patterns, each run only when a cheap substring gate says it could match
    (see ``_FAMILIES``); strings shorter than 5 characters are returned untouched. Secrets
    shorter than :data:`MIN_SECRET_LEN` (6) are ignored: redacting "abc" everywhere would
    wreck the log without protecting anything.
    """

    secrets: set[str] = field(default_factory=set)
    _ordered: tuple[str, ...] = field(init=False, repr=False, default=())
    _secret_re: re.Pattern[str] | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        self.secrets, given = set(), self.secrets
        self.add(given)

    def add(self, secrets: Iterable[str]) -> None:
        """Add secrets (never removes: a rotated-out token is still a secret)."""
        new = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LEN}
        if not new <= self.secrets:
            self.secrets |= new
            self._compile()

    def _compile(self) -> None:
        ordered = tuple(sorted(self.secrets, key=len, reverse=True))
        self._secret_re = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._ordered = ordered  # swapped last: readers on other threads see a whole state

    def redact(self, text: str) -> str:
        """``text`` with every secret / token replaced by ``***``."""
        if len(text) < _FAST_PATH_LEN:
            return text
        secret_re = self._secret_re
        for secret in self._ordered:
            if secret in text and secret_re is not None:
                text = secret_re.sub(REDACTED, text)
                break
        for gates, gate_re, pattern in _FAMILIES:
            for gate in gates:
                if gate in text:
                    if gate_re is None or gate_re.search(text) is not None:
                        text = pattern.sub(_replace, text)
                    break
        return text

    def redact_value(self, value: Any) -> Any:
        """Redact a log value: strings, nested dicts/lists/tuples/sets; other objects are
        turned into strings first (what the renderer would print anyway)."""
        if type(value) is str:
            return self.redact(value)
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, str):
            return self.redact(str(value))
        if isinstance(value, dict):
            return {self._key(k): self.redact_value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [self.redact_value(v) for v in value]
        return self.redact(_stringify(value))

    def _key(self, key: Any) -> Any:
        if isinstance(key, str):
            return self.redact(key)
        if key is None or isinstance(key, (bool, int, float)):
            return key
        return self.redact(str(key))  # JSON keys must be strings

    def __call__(self, _logger: Any, _method: str, event_dict: dict) -> dict:
        """structlog processor form: redact every value of ``event_dict`` in place."""
        for key, value in event_dict.items():
            if key not in _SKIP_KEYS:
                event_dict[key] = self.redact_value(value)
        return event_dict


_SKIP_KEYS = frozenset({"ts", "level", "logger", "_record", "_from_structlog"})


def _stringify(value: Any) -> str:
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, (PurePath, uuid.UUID, datetime, date, Decimal)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    return repr(value)


_SECRET_KEY = re.compile(r"token|secret|passw|api[_-]?key|authorization|credential",
                         re.IGNORECASE)


def find_secrets(tree: Any) -> list[str]:
    """String values (>= 6 chars) under secret-looking keys (``token``, ``bot_token``,
    ``apiKey``, ``signing_secret``, ``password``, ``Authorization`` header...) anywhere in
    a parsed, env-substituted config tree — what :func:`configure_logging` and
    :func:`update_secrets` should be given. Lists under such a key count too; a
    ``*_env`` key names an environment variable, not a secret (its value is in
    ``LoadedConfig.secrets``)."""
    found: list[str] = []

    def walk(node: Any, secret: bool) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if str(k).lower().endswith("_env"):  # api_key_env: a variable's name
                    continue
                walk(v, secret or bool(_SECRET_KEY.search(str(k))))
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v, secret)
        elif secret and isinstance(node, str) and len(node) >= MIN_SECRET_LEN:
            found.append(node)

    walk(tree, False)
    return found


def config_secrets(loaded: Any) -> list[str]:
    """Every secret of a loaded config for the log redactor: the values under
    secret-looking keys (:func:`find_secrets`) and the named secrets of the config
    (``LoadedConfig.secrets``: ``${VAR}`` references to secret-named variables too)."""
    named = getattr(loaded, "secrets", {})
    return find_secrets(loaded.raw) + [v for k, v in named.items()
                                       if not k.lower().endswith("_env")]  # a var's name
