"""Pure rules the heartbeat runner applies (DESIGN.md "Scheduler", seed 001 §9.1-9.2).

- :func:`strip_heartbeat_ack` — is a reply the ``HEARTBEAT_OK`` "nothing to report" ack?
- :func:`heartbeat_file_is_empty` — does HEARTBEAT.md have anything to act on?
- :func:`in_active_hours` — is now inside the configured ``active_hours`` window?
- :class:`DeliveryDeduper` — identical alert text is not delivered twice within 24 h.
- :func:`default_heartbeat_prompt` — the default heartbeat prompt.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path

import structlog

from runtime.clock import Clock
from runtime.state_files import report_corrupt
from runtime.storage.documents import DocumentRecords
from runtime.storage.embedded.document_file import DocumentFile
from scheduler.cron.crontab import resolve_tz

log = structlog.get_logger(__name__)

__all__ = [
    "DEFAULT_ACK_MAX_CHARS",
    "DEFAULT_HEARTBEAT_EVERY",
    "HEARTBEAT_TOKEN",
    "AckResult",
    "DeliveryDeduper",
    "default_heartbeat_prompt",
    "heartbeat_file_is_empty",
    "in_active_hours",
    "parse_hhmm",
    "strip_heartbeat_ack",
]

HEARTBEAT_TOKEN = "HEARTBEAT_OK"
DEFAULT_ACK_MAX_CHARS = 300  # seed 001 §9.2 ackMaxChars
DEFAULT_HEARTBEAT_EVERY = 1800.0  # seconds; seed 001 §9.2 every "30m"

_DEFAULT_PROMPT = (
    "Read HEARTBEAT.md if it exists (workspace context). Follow it strictly. "
    "Do not infer or repeat old tasks from prior chats. "
    "If nothing needs attention, reply HEARTBEAT_OK."
)


def default_heartbeat_prompt() -> str:
    """The default heartbeat prompt (seed 001 §9.1)."""
    return _DEFAULT_PROMPT


@dataclass(frozen=True, slots=True)
class AckResult:
    """``is_ack``: the reply means "nothing to report" (do not deliver, leave no transcript
    trace). ``remaining``: the reply without the token — the short note of an ack, or the
    alert text to deliver when not an ack."""

    is_ack: bool
    remaining: str


# The token, optionally wrapped in markdown emphasis/code, quotes or HTML tags and followed
# by punctuation: HEARTBEAT_OK, **HEARTBEAT_OK**, `HEARTBEAT_OK`, "HEARTBEAT_OK", «HEARTBEAT_OK»,
# <code>HEARTBEAT_OK</code>, HEARTBEAT_OK.  **HEARTBEAT_OK!** (as channels/outbound/silent.py)
_WRAP = r"(?:[*_`~\"'“”‘’«»„‹›「」『』]|</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?>){0,6}"
_TOKEN = rf"{_WRAP}HEARTBEAT_OK[.!?。！]*{_WRAP}[.!?。！]*"
_EDGE_SEP = " \t\r\n-–—:;,"


@functools.cache  # compiled by the first heartbeat reply (issue 9, cold start)
def _ack_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(token at the start, token at the end)."""
    return re.compile(rf"^\s*{_TOKEN}(?![\w])"), re.compile(rf"(?<![\w*_`~]){_TOKEN}\s*$")


def strip_heartbeat_ack(text: str, ack_max_chars: int = DEFAULT_ACK_MAX_CHARS) -> AckResult:
    """Classify a heartbeat reply (seed 001 §9.1 HEARTBEAT_OK).

    The token counts only at the start or end of the reply (bare, in ``**bold**``,
    ``_italic_``, backticks, or with trailing ``.``/``!``). Then the reply is an ack when
    what remains (stripped) has at most ``ack_max_chars`` characters; otherwise it is not
    an ack and ``remaining`` (the text without the token) is the alert to deliver.
    Without an edge token (including a token mid-text): ``AckResult(False, text)`` with
    ``text`` unchanged. The token is case-sensitive.
    """
    if not text:
        return AckResult(False, text or "")
    body, found = text, False
    at_start, at_end = _ack_patterns()
    m = at_start.match(body)
    if m:
        body, found = body[m.end():], True
    m = at_end.search(body)
    if m:
        body, found = body[: m.start()], True
    if not found:
        return AckResult(False, text)
    remaining = body.strip(_EDGE_SEP)
    return AckResult(len(remaining) <= ack_max_chars, remaining)


@functools.cache  # compiled by the first beat that reads HEARTBEAT.md (issue 9, cold start)
def _empty_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(an HTML comment, a line with nothing to act on)."""
    return re.compile(r"<!--.*?(-->|\Z)", re.DOTALL), re.compile(
        r"^(?:"
        r"#{1,6}(?:\s.*)?"  # markdown heading
        r"|(?:[-*+]|\d+[.)])(?:\s+\[[ xX]?\])?"  # list item, nothing after marker/checkbox
        r"|[-*_=]{3,}"  # rule / setext underline
        r")$")


def heartbeat_file_is_empty(text: str | None) -> bool:
    """True when HEARTBEAT.md has nothing to act on: only blank lines, markdown headings,
    empty list items (``-``, ``*``, ``1.``, ``- [ ]``), horizontal rules and HTML comments
    (also unterminated). ``None`` (no file) counts as empty."""
    if not text:
        return True
    comment, empty_line = _empty_patterns()
    for line in comment.sub("", text).splitlines():
        s = line.strip()
        if s and not empty_line.match(s):
            return False
    return True


def parse_hhmm(value: str, *, allow_24: bool = False) -> int:
    """Minutes after midnight for ``"HH:MM"`` (``"24:00"`` only with ``allow_24``).

    Raises ``ValueError`` with the offending value.
    """
    m = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*", value or "")
    if not m:
        raise ValueError(f"invalid time {value!r}: expected HH:MM")
    h, mi = int(m.group(1)), int(m.group(2))
    if (h, mi) == (24, 0) and allow_24:
        return 1440
    if h > 23 or mi > 59:
        raise ValueError(f"invalid time {value!r}: expected 00:00-23:59"
                         + (" or 24:00" if allow_24 else ""))
    return h * 60 + mi


def in_active_hours(now_epoch: float, start: str, end: str,
                    tz: str | tzinfo | None = None) -> bool:
    """Whether ``now_epoch`` falls in the daily window [start, end) in ``tz`` (IANA name or
    tzinfo, None = UTC), seed 001 §9.2 activeHours.

    ``start``/``end`` are ``"HH:MM"``; ``end`` may be ``"24:00"``. A window with
    start > end crosses midnight (``22:00``-``06:00``); start == end means always active.
    Raises ``ValueError`` for malformed times or an unknown zone.
    """
    a, b = parse_hhmm(start), parse_hhmm(end, allow_24=True)
    local = datetime.fromtimestamp(now_epoch, resolve_tz(tz))
    if a == b or (a == 0 and b == 1440):
        return True
    t = local.hour * 60 + local.minute + local.second / 60
    if a < b:
        return a <= t < b
    return t >= a or t < b


def _normalize(text: str) -> str:
    return " ".join(text.split())


class DeliveryDeduper:
    """Remembers delivered alert texts per agent for ``window`` seconds (default 24 h).

    Texts are compared after whitespace normalisation and kept only as SHA-256 digests;
    entries older than the window are pruned on every call, and at most ``max_entries``
    are kept (oldest evicted first), so memory stays bounded.
    """

    def __init__(self, clock: Clock, window: float = 86400.0, max_entries: int = 10_000,
                 path: Path | None = None, problems: list[str] | None = None,
                 records: DocumentRecords | None = None) -> None:
        self._clock, self._window, self._max = clock, float(window), max_entries
        self._entries: OrderedDict[tuple[str, bytes], float] = OrderedDict()
        # persisted so a restart does not repeat yesterday's alert: the file at ``path``
        # or ``records`` (PostgreSQL, runtime.storage.documents)
        self._store: DocumentRecords | None = records if records is not None else (
            DocumentFile(path, durable=False) if path is not None else None)
        self._problems = problems
        if self._store is not None:
            self._load(self._store)

    def _load(self, store: DocumentRecords) -> None:
        """Read the ledger. A corrupt one is reported (``runtime.state_files``), its bytes
        copied aside, and the de-dup starts empty (at worst an alert repeats once); when
        the copy fails the ledger is not written at all."""
        try:
            raw = store.read()
            if raw is None:
                return
            rows = json.loads(raw.decode("utf-8"))
            for agent_id, digest, ts in sorted(rows, key=lambda r: r[2]):
                self._entries[(agent_id, bytes.fromhex(digest))] = float(ts)
        except (OSError, ValueError, TypeError) as exc:
            self._entries.clear()
            copy = store.keep_aside() if not isinstance(exc, OSError) else None
            if copy is None:
                self._store = None  # never overwrite bytes we could not keep
            report_corrupt(
                "heartbeat alert ledger", store.path, f"{type(exc).__name__}: {exc}",
                problems=self._problems,
                effect="alerts of the last 24 h are forgotten (one may repeat)"
                       + (f"; the old file is kept as {copy}" if copy else
                          "; the ledger is not saved until the file is fixed"),
                fix=(f"nothing to do; delete {copy} once inspected" if copy else
                     f"move {store.path} away; it is recreated"))
        self._prune(self._clock.time())

    def _save(self) -> None:
        if self._store is not None:
            rows = [[a, d.hex(), ts] for (a, d), ts in self._entries.items()]
            try:
                self._store.write(json.dumps(rows).encode())
            except OSError as exc:
                log.error("heartbeat_ledger_write_failed", path=str(self._store.path),
                          error=str(exc))

    @staticmethod
    def _key(agent_id: str, text: str) -> tuple[str, bytes]:
        return agent_id, hashlib.sha256(_normalize(text).encode()).digest()

    def _prune(self, now: float) -> None:
        while self._entries:
            _key, ts = next(iter(self._entries.items()))
            if now - ts < self._window and len(self._entries) <= self._max:
                break
            self._entries.popitem(last=False)

    def _merge_shared(self) -> None:
        """A store shared by replicas (``shared``): take in what the others recorded (the
        newer time wins), so an alert one replica delivered is not repeated by another."""
        if self._store is None or not getattr(self._store, "shared", False):
            return
        try:
            raw = self._store.read()
            rows = json.loads(raw.decode("utf-8")) if raw else []
            theirs = {(a, bytes.fromhex(d)): float(ts) for a, d, ts in rows}
        except (OSError, ValueError, TypeError) as exc:
            log.warning("heartbeat_ledger_refresh_failed", error=str(exc))
            return
        merged = {**theirs, **{k: max(v, theirs.get(k, v)) for k, v in self._entries.items()}}
        self._entries = OrderedDict(sorted(merged.items(), key=lambda kv: kv[1]))

    def seen(self, agent_id: str, text: str) -> bool:
        """True if the same (normalised) text was recorded for the agent within the window."""
        self._merge_shared()
        now = self._clock.time()
        self._prune(now)
        ts = self._entries.get(self._key(agent_id, text))
        return ts is not None and now - ts < self._window

    def record(self, agent_id: str, text: str) -> None:
        """Remember that ``text`` was delivered for ``agent_id`` now."""
        self._merge_shared()
        now = self._clock.time()
        key = self._key(agent_id, text)
        self._entries.pop(key, None)
        self._entries[key] = now  # newest last keeps the dict ordered by time
        self._prune(now)
        self._save()

    def __len__(self) -> int:
        return len(self._entries)
