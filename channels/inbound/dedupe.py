"""Exactly-once intake of inbound messages across restarts (and replicas).

Platforms redeliver: Slack retries an event it thinks we missed (same ``event_id``,
``retry_attempt`` > 0), Telegram re-sends updates whose offset was not confirmed before a
crash, Discord replays on RESUME. The gateway calls ``check_and_mark(dedupe_key(msg))``
before running a message and drops it when the key was seen within the TTL.

The keys live in a :class:`runtime.storage.dedupe.DedupeRecords` store: by default the
append-only file ``channels/inbound-seen.jsonl`` (``runtime.storage.embedded.dedupe_file``),
with ``storage.backend: postgres`` the table ``inbound_seen``, whose primary key makes "is
this key new?" one unique constraint for every replica.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import structlog

from channels.base import InboundMessage
from runtime.clock import Clock
from runtime.state_files import report_corrupt
from runtime.storage.dedupe import DEFAULT_TTL, DedupeRecords
from runtime.storage.embedded.dedupe_file import DedupeFile

log = structlog.get_logger(__name__)



def dedupe_key(msg: InboundMessage) -> str | None:
    """``channel:account:(group_id or peer_id):message_id``, or None when the message has no
    id (such messages are not deduplicated)."""
    if not msg.message_id:
        return None
    where = msg.group_id or msg.peer_id
    return f"{msg.channel.lower()}:{msg.account_id}:{where}:{msg.message_id}"


def refused_key(key: str) -> str:
    """The ledger key of a message the access policy refused: ``refused:<sha256 hex[:32]>``
    of its :func:`dedupe_key`, so a redelivery is still recognised but the ledger keeps
    neither the sender nor the platform's message id."""
    return "refused:" + hashlib.sha256(key.encode()).hexdigest()[:32]


class InboundDedupe:
    """Seen-keys set backed by ``records`` (default: the append-only file at ``path``).

    ``ttl`` is seconds; ``max_entries`` bounds memory (the oldest keys go first). Raises
    OSError when the store cannot be opened or written.
    """

    def __init__(self, path: Path | None, clock: Clock, ttl: float = DEFAULT_TTL,
                 max_entries: int = 100_000, problems: list[str] | None = None,
                 records: DedupeRecords | None = None) -> None:
        if ttl <= 0 or max_entries < 1:
            raise ValueError("ttl must be > 0 and max_entries >= 1")
        self.records: DedupeRecords = records if records is not None else \
            DedupeFile(Path(path or ""), problems)
        self.path = self.records.path
        self._clock = clock
        self.ttl = float(ttl)
        self.max_entries = max_entries
        self._seen: dict[str, float] = {}  # insertion order ~ time order
        self._lines = 0
        self._problems = problems
        self._load()

    def _load(self) -> None:
        """Read the live keys and compact the store."""
        now = self._clock.time()
        self._seen = self.records.load(now, self.ttl)
        self._trim()
        self._rewrite()

    def _rewrite(self) -> None:
        self.records.compact(self._seen, self._clock.time(), self.ttl)
        self._lines = len(self._seen)

    def _trim(self) -> None:
        while len(self._seen) > self.max_entries:
            self._seen.pop(next(iter(self._seen)))

    def _expire(self, now: float) -> None:
        for key, ts in self._seen.items():
            if now - ts < self.ttl:
                return
            del self._seen[key]
            break  # dict changed size: one per call keeps each call O(1) amortised

    def seen(self, key: str) -> bool:
        """True if ``key`` was marked within the TTL (nothing is written)."""
        ts = self._seen.get(key)
        return ts is not None and self._clock.time() - ts < self.ttl

    def check_and_mark(self, key: str) -> bool:
        """True if ``key`` is new (and now marked seen), False if seen within the TTL.

        Cost: a dict lookup plus one small ``write`` to the file for new keys."""
        now = self._clock.time()
        if not self._mark(key, now):
            return False
        return self._stored(self.records.add(key, now, self.ttl))

    async def acheck_and_mark(self, key: str) -> bool:
        """:meth:`check_and_mark` for the event loop: a store that can (PostgreSQL:
        ``aadd``) is awaited instead of blocking the loop; the file is appended in place."""
        now = self._clock.time()
        if not self._mark(key, now):
            return False
        aadd = getattr(self.records, "aadd", None)
        return self._stored(await aadd(key, now, self.ttl) if aadd is not None
                            else self.records.add(key, now, self.ttl))

    def _mark(self, key: str, now: float) -> bool:
        """Mark ``key`` seen in memory; False when it already was within the TTL."""
        self._expire(now)
        self._expire(now)
        ts = self._seen.get(key)
        if ts is not None and now - ts < self.ttl:
            return False
        self._seen.pop(key, None)
        self._seen[key] = now
        self._trim()
        return True

    def _stored(self, new: bool) -> bool:
        if not new:
            return False  # a shared store: another replica took it first
        self._lines += 1
        if self._lines > 2 * self.max_entries:
            self._rewrite()
        return True

    def __len__(self) -> int:
        return len(self._seen)

    def close(self) -> None:
        """Close the store (a file stays valid: every line is complete)."""
        self.records.close()


def open_dedupe(path: Path, clock: Clock, problems: list[str] | None = None,
                records: DedupeRecords | None = None) -> InboundDedupe | None:
    """The gateway's ledger, or None (reported) when its store cannot be used at all: only
    duplicate detection is lost, every channel still runs."""
    try:
        return InboundDedupe(path, clock, problems=problems, records=records)
    except OSError as exc:
        where = records.path if records is not None else path
        report_corrupt("inbound dedupe ledger", where, f"{type(exc).__name__}: {exc}",
                       problems=problems,
                       effect="duplicate detection is off (a redelivered message may run "
                              "twice); the file is not touched",
                       fix=f"move {path} away (it is recreated) and restart the gateway")
        return None
