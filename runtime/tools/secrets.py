"""Secrets the model never sees: the named secret values of the config and the scrubber
that replaces them in tool results.

``SecretScrubber({"OPENAI_API_KEY": "sk-..."})`` turns every occurrence of a configured
secret value in a text into ``[redacted:OPENAI_API_KEY]`` (longest value first, so a
secret that contains another is hidden whole). The turn applies it to every tool result
(exec output, file reads, fetched pages, MCP results) before the model, the transcript or
the timeline get the text; background exec reports pass through it too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger(__name__)

MIN_SECRET_LEN = 6
"""Shorter values are not scrubbed (hiding "abc" everywhere protects nothing)."""


@dataclass(frozen=True)
class SecretScrubber:
    """``named``: secret name (an environment variable name, or the config path of a
    secret written literally) -> value. Values shorter than :data:`MIN_SECRET_LEN` are
    ignored; when two names share a value the first one names it."""

    named: Mapping[str, str] = field(default_factory=dict)
    _by_value: dict[str, str] = field(init=False, repr=False, default_factory=dict)
    _re: re.Pattern[str] | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        by_value: dict[str, str] = {}
        for name, value in self.named.items():
            if isinstance(value, str) and len(value) >= MIN_SECRET_LEN:
                by_value.setdefault(value, name)
        ordered = sorted(by_value, key=len, reverse=True)
        object.__setattr__(self, "_by_value", by_value)
        object.__setattr__(self, "_re", re.compile("|".join(map(re.escape, ordered)))
                           if ordered else None)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.named)

    def scrub(self, text: str, *, where: str = "", session_key: str = "",
              quiet: bool = False) -> str:
        """``text`` with every secret value replaced by ``[redacted:NAME]``. Each text that
        had one is logged (``secret_redacted``: the names and ``where``, never a value)
        unless ``quiet`` (text scrubbed again at every use: stored memory entries)."""
        if self._re is None or not text:
            return text
        hits: list[str] = []

        def repl(m: re.Match[str]) -> str:
            name = self._by_value[m.group(0)]
            hits.append(name)
            return f"[redacted:{name}]"

        out = self._re.sub(repl, text)
        if hits and not quiet:
            log.warning("secret_redacted", names=sorted(set(hits)), where=where,
                        session_key=session_key)
        return out

    def names_in(self, data: bytes) -> list[str]:
        """Names of the secrets whose value occurs in ``data``, sorted: as UTF-8, UTF-16
        or UTF-32, also inside gzip/bzip2/xz/zip containers (runtime/tools/secret_scan.py
        says what is not covered); a file that holds one is never uploaded
        (gateway/outbound/media.py)."""
        if not self._by_value:
            return []
        from runtime.tools.secret_scan import encodings_of, holds
        forms = {form: name for value, name in self._by_value.items()
                 for form in encodings_of(value)}
        return sorted({forms[form] for form in holds(data, forms)})

    def is_secret(self, value: str) -> bool:
        return value in self._by_value


NO_SECRETS = SecretScrubber()
