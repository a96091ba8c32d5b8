"""The PostgreSQL :class:`runtime.timeline.store.TimelineStore` (issue 15 "Timeline on
PostgreSQL"). Schema: ``migrations/0002_timeline.sql``.

Appends: every ``append_many`` (a turn's events: one transaction) goes through the
store's group commit (``batch.py``): all that queued meanwhile, of every session, in one
transaction, usually ONE statement that moves each session's head only if it is still
where the chain was computed from and inserts the events of exactly those sessions; a
session whose head another replica moved is read again and re-chained. The conditional
head update row-locks the ``timelines`` row, so appends to one session serialise across
every gateway replica while different sessions share one round trip. The locked path
(``commit_locked``: ``SELECT ... FOR UPDATE`` on the head, then insert) is the fallback
for a contended head and for a round the database refused. The chain (seq, clamped
timestamp, ``prev_hash``, ``hash``) is computed by ``chain.py`` with the SQLite writer's
rules and hash function, so it is byte-identical on both backends.

Triggers (installed by the migration) refuse UPDATE/DELETE/TRUNCATE of events, inserts
into an archived or unknown timeline, un-archiving, moving a head backwards, changing a
timeline's identity and deleting a timelines row. Opening the store checks they are all
there: missing ones are logged (``timeline_triggers_missing``) and recreated.

Verification runs in one REPEATABLE READ snapshot and streams the events through a
server-side cursor into :class:`runtime.timeline.verify.ChainVerifier`.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import structlog

from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.storage.postgres.fence import Fence, TimelineFencedError, still_held
from runtime.storage.postgres.retry import RetryStats
from runtime.storage.postgres.timeline.batch import AppendBatcher
from runtime.storage.postgres.timeline.chain import (
    EVENTS_SQL,
    Head,
    Item,
    chain,
    event_of,
    info_of,
)
from runtime.timeline.model import (
    TimelineClosedError,
    TimelineError,
    TimelineEvent,
    TimelineInfo,
    TimelineNotFoundError,
    VerifyReport,
)
from runtime.timeline.verify import INFO_COLS, ChainVerifier

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
    # once per statement over its rows (migration 0120): group commits insert hundreds
    "timeline_events_active_only": "AFTER INSERT ON timeline_events REFERENCING NEW TABLE "
    "AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION timeline_events_active_only_stmt()",
    "timelines_guard": "BEFORE UPDATE ON timelines FOR EACH ROW EXECUTE FUNCTION "
    "timelines_guard()",
}
TRIGGERS = tuple(_TRIGGERS)
_INSERT_EVENTS = (
    f"INSERT INTO timeline_events ({EVENTS_SQL}) SELECT * FROM unnest($1::text[], "
    "$2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[])")
_DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)


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
        self.heads: dict[str, tuple[int, str, int]] = {}
        self.batcher = AppendBatcher(self)

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

    async def append_many(self, session_id: str, items: list[Item],
                          session_key: str = "", *, fence: Fence | None = None
                          ) -> list[TimelineEvent | BaseException]:
        """All ``items`` of one session in ONE transaction (shared with other sessions'
        appends by the group commit); per item the committed event or the error that
        refused it (a database failure fails only the items it hit). ``fence``: written
        only while that lane lease is current, else every item is
        :class:`TimelineFencedError` and nothing is written (``fence.py``)."""
        self._check_open(write=True)
        results = await self.batcher.submit(session_id, items, session_key, fence)
        return [r if isinstance(r, BaseException) else event_of(r) for r in results]

    async def commit_locked(self, sid: str, items: list[Item], key: str,
                            fence: Fence | None = None) -> list[Any]:
        """``items`` alone under the head's row lock; per item its row or the error. A
        race on the create (another replica) is re-read once."""
        for last in (False, True):
            try:
                results, head = await self._locked_commit(sid, items, key, fence)
            except asyncpg.UniqueViolationError as exc:
                if not last:
                    continue
                error: Exception = exc
            except _DB_ERRORS as exc:
                error = exc
            else:
                if head is not None and head.status == "active":
                    self.heads[sid] = head.key()
                else:
                    self.heads.pop(sid, None)
                return results
            break
        log.error("timeline_write_failed", session_id=sid, error=str(error))
        return [TimelineError(f"timeline write failed: {error}") for _ in items]

    async def _locked_commit(self, sid: str, items: list[Item], session_key: str,
                             fence: Fence | None = None) -> tuple[list[Any], Head | None]:
        async with self.pool.acquire() as conn, conn.transaction():
            if fence is not None and not await still_held(conn, fence):
                return [TimelineFencedError(f"{sid}: the lane lease {fence[0]} is no longer "
                                            f"{fence[1]}'s (generation {fence[2]})")
                        for _ in items], None
            row = await conn.fetchrow(
                "SELECT last_seq, last_hash, last_timestamp, status FROM timelines "
                "WHERE session_id = $1 FOR UPDATE", sid)
            head, rows, results = chain(Head(*row) if row else None, sid, items,
                                        session_key)
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
        sql = f"SELECT {EVENTS_SQL} FROM timeline_events WHERE session_id = $1"
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
        out = [event_of(r) for r in await self._fetch(sql, *args)]
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
        return [info_of(r) for r in await self._fetch(sql, *args)]

    async def info(self, session_id: str) -> TimelineInfo | None:
        rows = await self._fetch(f"SELECT {INFO_COLS} FROM timelines WHERE session_id = $1",
                                 session_id)
        return info_of(rows[0]) if rows else None

    async def verify(self, session_id: str | None = None) -> VerifyReport:
        self._check_open(write=False)
        async with self.pool.acquire() as conn, conn.transaction(
                isolation="repeatable_read", readonly=True):
            if session_id is None:
                heads = await conn.fetch(f"SELECT {INFO_COLS} FROM timelines")
                cursor = conn.cursor(f"SELECT {EVENTS_SQL} FROM timeline_events "
                                     "ORDER BY session_id COLLATE \"C\", seq", prefetch=2000)
            else:
                heads = await conn.fetch(f"SELECT {INFO_COLS} FROM timelines "
                                         "WHERE session_id = $1", session_id)
                cursor = conn.cursor(f"SELECT {EVENTS_SQL} FROM timeline_events "
                                     "WHERE session_id = $1 ORDER BY seq", session_id,
                                     prefetch=2000)
            verifier = ChainVerifier({r[0]: tuple(r) for r in heads}, session_id)
            async for row in cursor:
                if not verifier.feed(tuple(row)):
                    break
        return verifier.finish()

    async def close(self) -> None:
        """Refuse further use once what was submitted is written (the pool belongs to the
        gateway)."""
        self._closed = True
        await self.batcher.close()
