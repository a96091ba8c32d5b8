"""The PostgreSQL :class:`runtime.timeline.store.TimelineStore` (issue 15 "Timeline on
PostgreSQL"). Schema: ``migrations/0002_timeline.sql``.

One call of ``append_many`` (a turn's events) is one transaction: the session's head row
is locked (``SELECT ... FOR UPDATE``), seq, the clamped timestamp, ``prev_hash`` and
``hash`` are assigned from it, the events are inserted and the head moved, then COMMIT.
The lock serialises appends to one session across every gateway replica; appends to
different sessions run in parallel on the pool's connections. Fast path: once this
process knows a session's head, the next append is ONE statement (the head update,
conditional on the head being unchanged, and the event insert in one CTE, its own
transaction); if another replica moved the head meanwhile, nothing is written and the
locked path runs instead. The hash is computed by
:func:`runtime.timeline.model.event_hash_raw`, the function the SQLite writer uses, over
the same canonical content text, so a chain is byte-identical on both backends.

Triggers (installed by the migration) refuse UPDATE/DELETE/TRUNCATE of events, inserts
into an archived or unknown timeline, un-archiving, moving a head backwards, changing a
timeline's identity and deleting a timelines row. Opening the store checks they are all
there: missing ones are logged (``timeline_triggers_missing``) and recreated.

Verification runs in one REPEATABLE READ snapshot and streams the events through a
server-side cursor into :class:`runtime.timeline.verify.ChainVerifier`.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import structlog

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.storage.postgres.retry import OUTAGE_RETRY, RetryStats, ride_out
from runtime.timeline.model import (
    GENESIS_HASH,
    TimelineArchivedError,
    TimelineClosedError,
    TimelineError,
    TimelineEvent,
    TimelineExistsError,
    TimelineInfo,
    TimelineNotFoundError,
    VerifyReport,
    event_hash_raw,
)
from runtime.timeline.verify import EVENT_COLS, INFO_COLS, ChainVerifier

log = structlog.get_logger(__name__)

_TRIGGERS = {
    "timeline_events_no_update": "BEFORE UPDATE ON timeline_events FOR EACH ROW EXECUTE "
    "FUNCTION timeline_refuse('timeline events are immutable: UPDATE refused')",
    "timeline_events_no_delete": "BEFORE DELETE ON timeline_events FOR EACH ROW EXECUTE "
    "FUNCTION timeline_refuse('timeline events are immutable: DELETE refused')",
    "timeline_events_no_truncate": "BEFORE TRUNCATE ON timeline_events FOR EACH STATEMENT "
    "EXECUTE FUNCTION timeline_refuse('timeline events are immutable: TRUNCATE refused')",
    "timelines_no_delete": "BEFORE DELETE ON timelines FOR EACH ROW EXECUTE FUNCTION "
    "timeline_refuse('timelines are permanent: DELETE refused')",
    "timelines_no_truncate": "BEFORE TRUNCATE ON timelines FOR EACH STATEMENT EXECUTE "
    "FUNCTION timeline_refuse('timelines are permanent: TRUNCATE refused')",
    "timeline_events_active_only": "BEFORE INSERT ON timeline_events FOR EACH ROW EXECUTE "
    "FUNCTION timeline_events_active_only()",
    "timelines_guard": "BEFORE UPDATE ON timelines FOR EACH ROW EXECUTE FUNCTION "
    "timelines_guard()",
}
TRIGGERS = tuple(_TRIGGERS)
_EVENTS_SQL = EVENT_COLS.replace("timestamp", '"timestamp"')
_INSERT_EVENTS = (
    f"INSERT INTO timeline_events ({_EVENTS_SQL}) SELECT * FROM unnest($1::text[], "
    "$2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[])")
# The fast path: move the head only if it is still where this process last left it, and
# insert the events only if it moved — one statement, one round trip, its own transaction.
_FAST_APPEND = (
    "WITH head AS (UPDATE timelines SET last_seq = $2, last_hash = $3, last_timestamp = $4 "
    "WHERE session_id = $1 AND last_seq = $5 AND last_hash = $6 AND status = 'active' "
    f"RETURNING 1) INSERT INTO timeline_events ({_EVENTS_SQL}) SELECT * FROM unnest("
    "$7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::text[], $12::text[], "
    "$13::text[], $14::text[]) WHERE EXISTS (SELECT 1 FROM head)")
_DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError)


def _event(row: Any) -> TimelineEvent:
    return TimelineEvent(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]),
                         row[6], row[7])


def _info(row: Any) -> TimelineInfo:
    return TimelineInfo(*tuple(row))


class _Head:
    __slots__ = ("created_at", "ended_at", "last_hash", "last_seq", "last_ts", "new",
                 "session_key", "status")

    def __init__(self, last_seq: int, last_hash: str, last_ts: int, status: str, *,
                 new: bool = False, session_key: str = "", created_at: int = 0) -> None:
        self.last_seq, self.last_hash, self.last_ts, self.status = (last_seq, last_hash,
                                                                    last_ts, status)
        self.new, self.session_key, self.created_at = new, session_key, created_at
        self.ended_at: int | None = None


def _chain(head: _Head | None, sid: str, items: list[tuple[str, str, str, int, str]],
           session_key: str) -> tuple[_Head | None, list[tuple], list[Any]]:
    """Assign seq/timestamp/prev_hash/hash to ``items`` from ``head`` (the same rules as
    the SQLite writer); returns (head, event rows, per-item row or error)."""
    rows: list[tuple] = []
    results: list[Any] = []
    for kind, eid, etype, ts, content in items:
        if kind == "create":
            if head is not None:
                results.append(TimelineExistsError(sid))
                continue
            head = _Head(0, GENESIS_HASH, ts, "active", new=True, session_key=session_key,
                         created_at=ts)
        elif head is None:
            results.append(TimelineNotFoundError(sid))
            continue
        elif head.status != "active":
            results.append(TimelineArchivedError(sid))
            continue
        seq = head.last_seq + 1
        ts = max(head.last_ts, ts)  # never decreasing, as on SQLite
        h = event_hash_raw(eid, sid, seq, ts, etype, content, head.last_hash)
        row = (eid, sid, seq, ts, etype, content, head.last_hash, h)
        rows.append(row)
        head.last_seq, head.last_hash, head.last_ts = seq, h, ts
        if etype == "SESSION_END":
            head.status, head.ended_at = "archived", ts
        results.append(row)
    return head, rows, results


class PgTimelineStore:
    """The timeline in PostgreSQL; construct with :meth:`open`. ``readonly`` refuses
    writes (TimelineError) and leaves missing triggers alone."""

    def __init__(self, pool: asyncpg.Pool, *, readonly: bool = False,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.pool = pool
        self.readonly = readonly
        self.clock = clock  # paces outage retries (retry.py)
        self.retry = RetryStats()
        self.path = "postgresql"  # what error messages and the CLI name
        self.missing_triggers: list[str] = []
        self._closed = False
        # (last_seq, last_hash, last_ts) of active timelines this process appended to
        self._heads: dict[str, tuple[int, str, int]] = {}

    @classmethod
    async def open(cls, pool: asyncpg.Pool, *, readonly: bool = False,
                   clock: Clock = SYSTEM_CLOCK) -> PgTimelineStore:
        """Check (and unless ``readonly`` recreate) the triggers. The schema must be
        migrated. ``clock`` paces the outage retries. Raises asyncpg errors when the
        database is unusable."""
        store = cls(pool, readonly=readonly, clock=clock)
        async with pool.acquire() as conn:
            have = {r[0] for r in await conn.fetch(
                "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgrelid IN "
                "('timelines'::regclass, 'timeline_events'::regclass)")}
            store.missing_triggers = [t for t in TRIGGERS if t not in have]
            if store.missing_triggers:
                log.warning("timeline_triggers_missing", path="postgresql",
                            missing=store.missing_triggers,
                            action="none (read-only)" if readonly else "recreated",
                            hint="someone with owner rights dropped the timeline's "
                                 "immutability triggers; run `tidegate timeline verify`")
                if not readonly:
                    for name in store.missing_triggers:
                        await conn.execute(f"CREATE TRIGGER {name} {_TRIGGERS[name]}")
        return store

    def _check_open(self, write: bool) -> None:
        if self._closed:
            raise TimelineClosedError("timeline store postgresql is closed")
        if write and self.readonly:
            raise TimelineError("timeline store postgresql is open read-only")

    async def create(self, session_id: str, session_key: str, event_id: str, timestamp: int,
                     content_json: str) -> TimelineEvent:
        return await self._one(session_id, ("create", event_id, "SESSION_CREATE", timestamp,
                                            content_json), session_key)

    async def append(self, session_id: str, event_id: str, event_type: str, timestamp: int,
                     content_json: str) -> TimelineEvent:
        return await self._one(session_id, ("append", event_id, event_type, timestamp,
                                            content_json), "")

    async def _one(self, session_id: str, item: tuple, session_key: str) -> TimelineEvent:
        (res,) = await self.append_many(session_id, [item], session_key)
        if isinstance(res, BaseException):
            raise res
        return res

    async def append_many(self, session_id: str, items: list[tuple[str, str, str, int, str]],
                          session_key: str = "") -> list[TimelineEvent | BaseException]:
        """All ``items`` of one session in ONE transaction; per item the committed event
        or the error that refused it (a database failure fails only the items it hit)."""
        self._check_open(write=True)
        try:
            results = await self._commit_riding_out_outages(session_id, items, session_key)
        except asyncpg.UniqueViolationError:
            # another replica created the session (or used an event id) concurrently:
            # re-read the head once; a second failure is reported per item below
            results = await self._commit_or_errors(session_id, items, session_key)
        except _DB_ERRORS as exc:
            if len(items) > 1:
                log.warning("timeline_batch_retry", size=len(items), error=str(exc))
                out: list[Any] = []
                for item in items:
                    out.extend(await self._commit_or_errors(session_id, [item], session_key))
                return out
            log.error("timeline_write_failed", session_id=session_id, error=str(exc))
            return [TimelineError(f"timeline write failed: {exc}")]
        return [r if isinstance(r, BaseException) else _event(r) for r in results]

    async def _commit_riding_out_outages(self, sid: str, items: list, key: str) -> list[Any]:
        """``_commit``, retried for up to OUTAGE_RETRY seconds of the store's clock while
        the server cannot be reached (a restart, a network cut), so a turn's events wait
        for the database instead of being lost (``self.retry`` counts the retries). A
        commit whose outcome the cut hid is looked up by its event ids before it is tried
        again (never written twice)."""
        async def recovered() -> list[Any] | None:
            rows = await self.pool.fetch(
                f"SELECT {_EVENTS_SQL} FROM timeline_events WHERE event_id = ANY($1) "
                "ORDER BY seq", [i[1] for i in items])
            return list(rows) if len(rows) == len(items) else None
        return await ride_out(lambda: self._commit(sid, items, key), what="timeline",
                              stats=self.retry, clock=self.clock, deadline_s=OUTAGE_RETRY,
                              recovered=recovered,
                              on_unreachable=lambda: self._heads.pop(sid, None),
                              session_id=sid)

    async def _commit_or_errors(self, sid: str, items: list, key: str) -> list[Any]:
        try:
            return [r if isinstance(r, BaseException) else _event(r)
                    for r in await self._commit(sid, items, key)]
        except _DB_ERRORS as exc:
            log.error("timeline_write_failed", session_id=sid, error=str(exc))
            return [TimelineError(f"timeline write failed: {exc}") for _ in items]

    async def _commit(self, sid: str, items: list, session_key: str) -> list[Any]:
        cached = self._heads.get(sid)
        if cached is not None and all(i[0] == "append" and i[2] != "SESSION_END"
                                      for i in items):
            fast = await self._fast_append(sid, items, cached)
            if fast is not None:
                return fast
        results, head = await self._locked_commit(sid, items, session_key)
        if head is not None and head.status == "active":
            self._heads[sid] = (head.last_seq, head.last_hash, head.last_ts)
        else:
            self._heads.pop(sid, None)
        return results

    async def _fast_append(self, sid: str, items: list, cached: tuple[int, str, int]
                           ) -> list[Any] | None:
        """Append on the cached head in one statement; None when the head moved (another
        replica appended, or the timeline was archived): the caller takes the lock path."""
        head, rows, results = _chain(_Head(*cached, "active"), sid, items, "")
        assert head is not None
        status = await self.pool.execute(
            _FAST_APPEND, sid, head.last_seq, head.last_hash, head.last_ts, cached[0],
            cached[1], *(list(col) for col in zip(*rows, strict=True)))
        if status != f"INSERT 0 {len(rows)}":
            self._heads.pop(sid, None)
            return None
        self._heads[sid] = (head.last_seq, head.last_hash, head.last_ts)
        return results

    async def _locked_commit(self, sid: str, items: list, session_key: str
                             ) -> tuple[list[Any], _Head | None]:
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT last_seq, last_hash, last_timestamp, status FROM timelines "
                "WHERE session_id = $1 FOR UPDATE", sid)
            head = _Head(*row) if row else None
            head, rows, results = _chain(head, sid, items, session_key)
            if not rows:
                return results, head
            assert head is not None
            if head.new:
                await conn.execute(
                    "INSERT INTO timelines (session_id, session_key, status, created_at, "
                    "ended_at, last_seq, last_hash, last_timestamp) "
                    "VALUES ($1, $2, 'active', $3, NULL, $4, $5, $6)",
                    sid, head.session_key, head.created_at, head.last_seq, head.last_hash,
                    head.last_ts)
            else:
                await conn.execute(
                    "UPDATE timelines SET last_seq = $2, last_hash = $3, last_timestamp = $4 "
                    "WHERE session_id = $1", sid, head.last_seq, head.last_hash, head.last_ts)
            await conn.execute(_INSERT_EVENTS, *(list(col) for col in zip(*rows, strict=True)))
            if head.status == "archived":  # after the events: SESSION_END needs it active
                await conn.execute("UPDATE timelines SET status = 'archived', ended_at = $2 "
                                   "WHERE session_id = $1", sid, head.ended_at)
        if head.status == "archived":
            log.info("timeline_archived", session_id=sid, events=head.last_seq)
        return results, head

    # ---- reads ---------------------------------------------------------------------------

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        self._check_open(write=False)
        async with self.pool.acquire() as conn:
            return await conn.fetch(sql, *args)

    async def events(self, session_id: str, from_ts: int | None = None,
                     after_seq: int | None = None, limit: int | None = None
                     ) -> list[TimelineEvent]:
        sql = f"SELECT {_EVENTS_SQL} FROM timeline_events WHERE session_id = $1"
        args: list[Any] = [session_id]
        if after_seq is not None:
            args.append(after_seq)
            sql += f" AND seq > ${len(args)}"
        if from_ts is not None:
            args.append(from_ts)
            sql += f' AND "timestamp" >= ${len(args)}'
        sql += " ORDER BY seq"
        if limit is not None:
            args.append(limit)
            sql += f" LIMIT ${len(args)}"
        out = [_event(r) for r in await self._fetch(sql, *args)]
        if not out and await self.info(session_id) is None:
            raise TimelineNotFoundError(session_id)
        return out

    async def timelines(self, session_key: str | None = None, status: str | None = None,
                        limit: int | None = None) -> list[TimelineInfo]:
        sql, args, where = f"SELECT {INFO_COLS} FROM timelines", [], []
        for col, value in (("session_key", session_key), ("status", status)):
            if value is not None:
                args.append(value)
                where.append(f"{col} = ${len(args)}")
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, created_order DESC"
        if limit is not None:
            args.append(limit)
            sql += f" LIMIT ${len(args)}"
        return [_info(r) for r in await self._fetch(sql, *args)]

    async def info(self, session_id: str) -> TimelineInfo | None:
        rows = await self._fetch(f"SELECT {INFO_COLS} FROM timelines WHERE session_id = $1",
                                 session_id)
        return _info(rows[0]) if rows else None

    async def verify(self, session_id: str | None = None) -> VerifyReport:
        self._check_open(write=False)
        async with self.pool.acquire() as conn, conn.transaction(
                isolation="repeatable_read", readonly=True):
            if session_id is None:
                heads = await conn.fetch(f"SELECT {INFO_COLS} FROM timelines")
                cursor = conn.cursor(f"SELECT {_EVENTS_SQL} FROM timeline_events "
                                     "ORDER BY session_id COLLATE \"C\", seq", prefetch=2000)
            else:
                heads = await conn.fetch(f"SELECT {INFO_COLS} FROM timelines "
                                         "WHERE session_id = $1", session_id)
                cursor = conn.cursor(f"SELECT {_EVENTS_SQL} FROM timeline_events "
                                     "WHERE session_id = $1 ORDER BY seq", session_id,
                                     prefetch=2000)
            verifier = ChainVerifier({r[0]: tuple(r) for r in heads}, session_id)
            async for row in cursor:
                if not verifier.feed(tuple(row)):
                    break
        return verifier.finish()

    async def close(self) -> None:
        """The pool belongs to the gateway; closing the store only refuses further use."""
        self._closed = True
