"""Outbox for replies that could not be delivered after the adapter's own retries.

Entries live in a :class:`runtime.storage.outbox.OutboxRecords` store: by default one
JSON file per entry under ``<dir>/`` (atomic write: temp + fsync + rename,
``runtime.storage.embedded.outbox_files``), with ``storage.backend: postgres`` the table
``outbox``; queued replies survive a restart. Retries back off 5 s, 30 s, 2 min, 10 min,
30 min, then every 30 min; an entry is never dropped silently: after ``max_attempts``
failed attempts (or a failure the platform says will not go away) it moves to the dead
letters (``<dir>/dead/``) with a loud log line.

Entry shape::

    {"id": "...", "message": {OutboundMessage fields}, "attempts": 1,
     "created_at": "<RFC 3339>", "next_attempt_at": <epoch s>, "last_error": "..."}

``attempts`` counts failed deliveries including the original one that caused the ``put``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from channels.base import DeliveryResult, OutboundMessage
from runtime.clock import Clock, parse_iso, utc_iso
from runtime.state_files import report_corrupt
from runtime.storage.embedded.outbox_files import OutboxFiles

if TYPE_CHECKING:  # the spill (a remote store's fallback) loads only with such a store
    from channels.outbound.spill import Spill
    from runtime.storage.outbox import OutboxRecords

log = structlog.get_logger(__name__)

BACKOFF = (5.0, 30.0, 120.0, 600.0, 1800.0)  # seconds; the last one repeats
MAX_ATTEMPTS = 50
WRITE_RETRY = 1.0  # seconds between attempts to store writes the store refused
_MAX_SLEEP = 60.0  # re-check at least this often (a wall-clock step shifts due times)
# A queued reply is a problem ("waiting") once it is this old (seconds) or its first retry
# failed too: a short blip is retried quietly, a reply the user still lacks is shown.
STUCK_AFTER = 60.0

Send = Callable[[OutboundMessage], Awaitable[DeliveryResult]]


@dataclass(slots=True)
class OutboxEntry:
    """One queued message. Times are epoch seconds."""

    id: str
    message: OutboundMessage
    attempts: int
    created_at: float
    next_attempt_at: float
    last_error: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "message": dataclasses.asdict(self.message),
                "attempts": self.attempts, "created_at": utc_iso(self.created_at),
                "next_attempt_at": self.next_attempt_at, "last_error": self.last_error}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> OutboxEntry:
        fields = {f.name for f in dataclasses.fields(OutboundMessage)}
        msg = OutboundMessage(**{k: v for k, v in d["message"].items() if k in fields})
        return cls(id=str(d["id"]), message=msg, attempts=int(d["attempts"]),
                   created_at=parse_iso(d["created_at"]),
                   next_attempt_at=float(d["next_attempt_at"]),
                   last_error=str(d.get("last_error", "")))


def backoff_delay(attempts: int) -> float:
    """Seconds to wait after the ``attempts``-th failure (1 -> 5 s, 2 -> 30 s, ... 5+ -> 30 min)."""
    return BACKOFF[min(max(attempts, 1), len(BACKOFF)) - 1]


class Outbox:
    """Durable retry queue over ``records`` (default: the files under ``dir``, created if
    missing); existing entries are loaded.

    One process delivers each entry (files: it owns the directory; PostgreSQL: the row's
    owner). A write the store refuses (disk trouble, a PostgreSQL outage) is kept in
    memory and retried by :meth:`run` until it lands: the entry is still delivered, never
    lost to the outage. A remote store (``records.remote``) is written off the event loop;
    while it refuses writes they are mirrored in the spill file under ``dir``
    (channels/outbound/spill.py), so a stop or a crash keeps them; :meth:`run` re-submits
    them once the store takes writes again, the next start re-submits what a previous run
    left, and the file goes once the store has them all.
    """

    def __init__(self, dir: Path | None, clock: Clock, *, max_attempts: int = MAX_ATTEMPTS,
                 problems: list[str] | None = None, records: OutboxRecords | None = None
                 ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.records: OutboxRecords = records if records is not None else OutboxFiles(dir)
        self.dir = Path(dir) if dir is not None else None
        self.dead_dir = self.dir / "dead" if self.dir is not None else None
        self._clock = clock
        self.max_attempts = max_attempts
        self._seq = 0
        self._entries: dict[str, OutboxEntry] = {}
        self._writes: dict[str, tuple[str, OutboxEntry]] = {}  # id -> (op, entry) to store
        self._remote = bool(getattr(self.records, "remote", False))
        self._wake = asyncio.Event()
        self._problems = problems
        self._spill: Spill | None = None
        if self._remote and self.dir is not None:
            from channels.outbound.spill import Spill
            self._spill = Spill(self.dir, clock, store=str(self.records.path),
                                problems=problems)
        self._load()
        if self._spill is not None:
            self._restore_spill(self._spill)

    def _load(self) -> None:
        entries, bad = self.records.load(OutboxEntry.from_json)
        for b in bad:  # only this entry is disabled: the others are sent
            report_corrupt("outbox", b.where, b.error, problems=self._problems,
                           effect=f"this queued reply is not sent; kept as {b.kept_as}",
                           fix=f"read {b.kept_as}, send it by hand if it matters, then "
                               "delete it")
        for entry in entries:
            self._entries[entry.id] = entry
        if self._entries:
            log.info("outbox_loaded", pending=len(self._entries), store=str(self.records.path))

    def _restore_spill(self, spill: Spill) -> None:
        """Queue the writes a previous run spilled (an id already in the store is updated,
        not duplicated) and try them now."""
        for op, entry in spill.restore(OutboxEntry.from_json):
            if op == "save":
                self._entries[entry.id] = entry
            else:  # delivered or buried before the outage ended: never sent again
                self._entries.pop(entry.id, None)
            self._writes.pop(entry.id, None)
            self._writes[entry.id] = (op, entry)
        if self._writes:
            self._write_pending()
            self._keep_spill()

    def _keep_spill(self) -> None:
        """Mirror the writes the store still refuses in the spill file; none: remove it."""
        if self._spill is not None:
            if self._writes:
                self._spill.keep(dict(self._writes))
            else:
                self._spill.clear()

    def spill_status(self) -> dict[str, Any] | None:
        """``{"count", "oldest_age_s", "path"}`` while writes wait in the spill file."""
        return self._spill.status() if self._spill is not None else None

    def problems(self) -> list[str]:
        """A waiting spill, for ``status``."""
        return self._spill.problems() if self._spill is not None else []

    def waiting(self, now: float | None = None) -> list[dict[str, Any]]:
        """The pending entries per channel account, oldest first::

            [{"channel", "account_id", "count", "stuck", "oldest_age_s", "attempts",
              "last_error", "next_attempt_in_s"}]

        ``stuck`` counts the entries older than :data:`STUCK_AFTER` or already retried
        (``attempts`` >= 2); ``attempts``/``last_error`` are the oldest entry's, and
        ``next_attempt_in_s`` is the soonest retry of the group (seconds from ``now``, the
        clock's time by default)."""
        t = self._clock.time() if now is None else now
        groups: dict[tuple[str, str], list[OutboxEntry]] = {}
        for e in sorted(self._entries.values(), key=lambda e: (e.created_at, e.id)):
            groups.setdefault((e.message.channel, e.message.account_id), []).append(e)
        out = []
        for (channel, account), entries in groups.items():
            oldest = entries[0]
            out.append({"channel": channel, "account_id": account, "count": len(entries),
                        "stuck": sum(1 for e in entries if e.attempts >= 2
                                     or t - e.created_at >= STUCK_AFTER),
                        "oldest_age_s": round(t - oldest.created_at, 1),
                        "attempts": oldest.attempts, "last_error": oldest.last_error,
                        "next_attempt_in_s": round(max(0.0, min(
                            e.next_attempt_at for e in entries) - t), 1)})
        return sorted(out, key=lambda g: -g["oldest_age_s"])

    def adopt(self) -> int:
        """Take over the entries of replicas that are gone (shared store only); returns
        how many. Raises OSError when the store cannot be reached."""
        taken = self.records.adopt(OutboxEntry.from_json)
        for entry in taken:
            self._entries[entry.id] = entry
            log.warning("outbox_adopted", entry_id=entry.id, channel=entry.message.channel)
        if taken:
            self._wake.set()
        return len(taken)

    def _store(self, op: str, entry: OutboxEntry) -> None:
        """Queue a write (``save``, ``delete`` or ``bury``; the newest per entry wins);
        a local store writes it now."""
        self._writes.pop(entry.id, None)
        self._writes[entry.id] = (op, entry)
        if self._remote:
            self._wake.set()
        else:
            self._write_pending()

    def _write_one(self, op: str, entry: OutboxEntry) -> None:
        if op == "save":
            self.records.save(entry.to_json())
        elif op == "delete":
            self.records.delete(entry.id)
        else:
            self.records.bury(entry.to_json())

    def _write_pending(self) -> None:
        """Store the queued writes in order; the first failure stops (retried later)."""
        for entry_id, pair in list(self._writes.items()):
            try:
                self._write_one(*pair)
            except OSError as exc:
                log.error("outbox_write_failed", entry_id=entry_id, op=pair[0],
                          error=str(exc), action="kept in memory, retried")
                return
            if self._writes.get(entry_id) is pair:  # not queued again meanwhile
                del self._writes[entry_id]

    def flush(self) -> int:
        """Store the queued writes now, blocking (at shutdown); returns how many are still
        unsaved (the store refused them and, for a remote store, the spill file too: logged)."""
        self._write_pending()
        self._keep_spill()
        if self._writes and self.spill_status() is None:
            log.error("outbox_writes_lost_at_exit", count=len(self._writes),
                      store=str(self.records.path))
            return len(self._writes)
        return 0

    def unsaved(self) -> int:
        """Writes not yet in the store (an outage, a full disk)."""
        return len(self._writes)

    def put(self, msg: OutboundMessage, error: str) -> str:
        """Queue ``msg`` after a failed delivery (``error`` = why). Returns the entry id.
        First retry after 5 s. A failed write is retried (``unsaved``), never raised."""
        now = self._clock.time()
        # Sorts by creation, also for entries created within the same millisecond.
        self._seq += 1
        entry_id = f"{int(now * 1000):013d}-{self._seq:06d}-{uuid.uuid4().hex[:6]}"
        entry = OutboxEntry(entry_id, msg, 1, now, now + backoff_delay(1), error)
        self._entries[entry_id] = entry
        self._store("save", entry)
        log.warning("outbox_put", entry_id=entry_id, channel=msg.channel, to=msg.to,
                    session_key=msg.session_key, error=error)
        self._wake.set()
        return entry_id

    def get(self, entry_id: str) -> OutboxEntry | None:
        """The pending entry ``entry_id`` or None."""
        return self._entries.get(entry_id)

    def due(self, now: float | None = None) -> list[OutboxEntry]:
        """Entries whose ``next_attempt_at <= now`` (epoch s; default: the clock), oldest due
        first."""
        t = self._clock.time() if now is None else now
        return sorted((e for e in self._entries.values() if e.next_attempt_at <= t),
                      key=lambda e: (e.next_attempt_at, e.id))

    def pending(self) -> int:
        """Number of entries waiting for delivery (dead letters excluded)."""
        return len(self._entries)

    def mark_sent(self, entry_id: str) -> None:
        """Delivered: delete the entry. Unknown ids are ignored."""
        entry = self._entries.pop(entry_id, None)
        if entry is None:
            return
        self._store("delete", entry)
        log.info("outbox_sent", entry_id=entry_id, channel=entry.message.channel,
                 attempts=entry.attempts + 1)

    def mark_failed(self, entry_id: str, error: str, *, remaining_text: str | None = None
                    ) -> None:
        """Another failed attempt: schedule the next by the backoff, or dead-letter the entry
        after ``max_attempts``. ``remaining_text`` replaces the message text when some parts
        were delivered (only the rest is retried). Raises KeyError for an unknown id."""
        entry = self._entries[entry_id]
        entry.attempts += 1
        entry.last_error = error
        if remaining_text is not None and remaining_text.strip():
            entry.message = dataclasses.replace(entry.message, text=remaining_text)
        if entry.attempts >= self.max_attempts:
            self.mark_dead(entry_id, error)
            return
        entry.next_attempt_at = self._clock.time() + backoff_delay(entry.attempts)
        self._store("save", entry)
        log.warning("outbox_retry_scheduled", entry_id=entry_id, attempts=entry.attempts,
                    next_attempt_at=utc_iso(entry.next_attempt_at), error=error)

    def mark_dead(self, entry_id: str, error: str) -> None:
        """Give up on an entry: move it to ``<dir>/dead/`` and log at error level.
        Raises KeyError for an unknown id."""
        entry = self._entries.pop(entry_id)
        entry.last_error = error
        self._store("bury", entry)
        log.error("outbox_dead_letter", entry_id=entry_id, channel=entry.message.channel,
                  to=entry.message.to, session_key=entry.message.session_key,
                  attempts=entry.attempts, error=error, store=str(self.records.path))

    def wake(self, channel: str | None = None) -> None:
        """Wake the ``run`` loop. With ``channel`` (it just reconnected), that channel's
        entries become due now (in memory; the stored schedule is unchanged)."""
        if channel is not None:
            now = self._clock.time()
            for e in self._entries.values():
                if e.message.channel == channel and e.next_attempt_at > now:
                    e.next_attempt_at = now
        self._wake.set()

    async def run(self, send: Send, stop_event: asyncio.Event) -> None:
        """Deliver due entries with ``send`` until ``stop_event`` is set.

        ``send`` returns a DeliveryResult (exceptions count as retryable failures). A failure
        with ``retryable=False`` is dead-lettered at once (a retry would fail the same way);
        a result carrying ``remaining_text`` (channels/outbound/delivery.py) keeps only the unsent rest.
        """
        while not stop_event.is_set():
            if self._writes:
                await self._flush_writes()
            for entry in self.due():
                if stop_event.is_set():
                    return
                if entry.id not in self._entries:
                    continue
                try:
                    result = await send(entry.message)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - an adapter bug must not stop the outbox
                    result = DeliveryResult(ok=False, error=f"{type(e).__name__}: {e}",
                                            retryable=True)
                if entry.id in self._entries:
                    self._record(entry.id, result)
            self._wake.clear()
            await self._wait(self._next_delay(), stop_event)

    async def _flush_writes(self) -> None:
        if self._remote:
            await asyncio.to_thread(self._write_pending)
            await asyncio.to_thread(self._keep_spill)
        else:
            self._write_pending()

    def _record(self, entry_id: str, result: DeliveryResult) -> None:
        try:
            if result.ok or (result.unconfirmed and not result.retryable):
                self.mark_sent(entry_id)  # unconfirmed: may have arrived, never resent
            elif not result.retryable:
                self.mark_dead(entry_id, result.error or "not retryable")
            else:
                self.mark_failed(entry_id, result.error or "delivery failed",
                                 remaining_text=getattr(result, "remaining_text", None))
        except OSError as e:  # disk trouble: keep the loop alive, the entry stays in memory
            log.error("outbox_write_failed", entry_id=entry_id, error=str(e))
            entry = self._entries.get(entry_id)
            if entry is not None:
                entry.next_attempt_at = self._clock.time() + backoff_delay(entry.attempts)

    def _next_delay(self) -> float | None:
        if self._writes:
            return WRITE_RETRY
        if not self._entries:
            return None
        nxt = min(e.next_attempt_at for e in self._entries.values())
        return min(_MAX_SLEEP, max(0.0, nxt - self._clock.time()))

    async def _wait(self, delay: float | None, stop_event: asyncio.Event) -> None:
        waiters = [asyncio.ensure_future(self._wake.wait()),
                   asyncio.ensure_future(stop_event.wait())]
        if delay is not None:
            waiters.append(asyncio.ensure_future(self._clock.sleep(delay)))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
