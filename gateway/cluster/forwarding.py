"""Turns of the synchronous surfaces on replicas (README "Replicas"): a message of the
OpenAI-compatible API, webchat, ``tidegate agent -m`` or the control API runs on the
replica that holds its session's lane, like a platform message, and its caller — an HTTP
client waiting on whichever replica received it — gets the reply from there.

The receiving replica writes the message as a ``cluster_work`` row (no inbound dedupe
key: the caller is waiting, nobody redelivers; written exactly once across a retried
insert, gateway/cluster/insert_once.py) and routes it through the lane lease
(:class:`gateway.cluster.work.ClusterWork`): it runs here when this replica holds (or
takes) the lane, else the row is queued for the holder. The holder relays the turn's
runtime events (text deltas, tool events) to the receiver with ``NOTIFY tidegate_turns``
(payload ``{"row": id, "ev": [event, ...]}``, batched, under PostgreSQL's 8000-byte
limit) while the turn runs — only for a streamed request — and at the end writes the
turn's result into the row (``work.result``) and notifies ``{"row": id, "result": ...}``
(``{"row": id, "done": true}`` when the result is too long for a notification: the
receiver reads the row). The receiver republishes the events on its own event bus under
the same run id, so its streaming responses (SSE, NDJSON, webchat) work unchanged, and
resolves the caller's future with the holder's result. A lost notification is covered
by polling the row every :data:`POLL` seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import asyncpg
import structlog

from gateway.cluster.db import ClusterUnavailable
from gateway.cluster.insert_once import insert_row
from gateway.journal.tracking import work_to_dict
from gateway.turns.work import UserWork
from runtime.events import EventBus, RuntimeEvent
from runtime.providers.base import ToolCall, Usage
from runtime.turn import TurnResult

log = structlog.get_logger(__name__)

TURNS = "tidegate_turns"  # NOTIFY channel of relayed events and results
NOTIFY_MAX = 7000  # bytes of one payload (PostgreSQL's limit is 8000)
BATCH = 0.01  # seconds the holder gathers events before one notification
POLL = 2.0  # seconds between reads of the row while no notification came
WAIT = 900.0  # seconds the receiver waits for the holder's result at most


def awaited(work: Any) -> bool:
    """A message whose caller waits for the result (no route: a local surface)."""
    return isinstance(work, UserWork) and work.route is None


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def encode_result(fut: asyncio.Future) -> dict[str, Any]:
    """The lane future's outcome as JSON: a TurnResult's fields, or ``{"status":
    "aborted"|"error", "error"}`` for anything else (an interrupted or failed turn)."""
    if fut.cancelled():
        return {"status": "error", "text": "", "error": "the turn was cancelled"}
    if fut.exception() is not None:
        exc = fut.exception()
        return {"status": "error", "text": "", "error": f"{type(exc).__name__}: {exc}"}
    result = fut.result()
    if isinstance(result, TurnResult):
        return json.loads(json.dumps(dataclasses.asdict(result), default=_plain))
    return {"status": "aborted", "text": "(interrupted)",
            "error": getattr(result, "reason", None) or type(result).__name__}


def decode_result(value: dict[str, Any], run_id: str, key: str) -> TurnResult:
    """The TurnResult :func:`encode_result` wrote (unknown fields ignored)."""
    names = {f.name for f in dataclasses.fields(TurnResult)}
    fields = {k: v for k, v in value.items() if k in names}
    fields.setdefault("run_id", run_id)
    fields.setdefault("session_key", key)
    fields.setdefault("session_id", "")
    fields.setdefault("status", "error")
    fields.setdefault("text", "")
    usage = fields.get("usage")
    fields["usage"] = Usage(**{k: v for k, v in usage.items()
                               if k in {f.name for f in dataclasses.fields(Usage)}}) \
        if isinstance(usage, dict) else Usage()
    fields["client_calls"] = [ToolCall(c["id"], c["name"], c.get("arguments") or {})
                              for c in fields.get("client_calls") or []
                              if isinstance(c, dict)]
    return TurnResult(**fields)


def _event_json(ev: RuntimeEvent) -> dict[str, Any]:
    return {"type": ev.type, "run_id": ev.run_id, "session_key": ev.session_key,
            "agent_id": ev.agent_id, "ts": ev.ts, "data": ev.data}


def _payloads(row: int, events: list[dict[str, Any]]) -> list[str]:
    """``{"row", "ev": [...]}`` notifications, each under :data:`NOTIFY_MAX` bytes; an
    event too large on its own has its text delta cut into pieces."""
    out: list[str] = []
    batch: list[str] = []
    size = 0
    for ev in events:
        raw = json.dumps(ev, default=_plain, ensure_ascii=False)
        if len(raw.encode()) > NOTIFY_MAX - 64:
            out += _split(row, ev)
            continue
        if batch and size + len(raw.encode()) > NOTIFY_MAX - 64:
            out.append(f'{{"row": {row}, "ev": [{",".join(batch)}]}}')
            batch, size = [], 0
        batch.append(raw)
        size += len(raw.encode()) + 1
    if batch:
        out.append(f'{{"row": {row}, "ev": [{",".join(batch)}]}}')
    return out


def _split(row: int, ev: dict[str, Any]) -> list[str]:
    delta = str((ev.get("data") or {}).get("delta") or "")
    if ev.get("type") != "message_update" or not delta:
        log.warning("cluster_event_not_relayed", event_type=ev.get("type"), row=row,
                    reason="larger than one notification")
        return []
    step = 1500  # characters: at most 6000 bytes of UTF-8
    return [json.dumps({"row": row, "ev": [{**ev, "data": {**ev["data"],
                                                           "delta": delta[i:i + step]}}]},
                       default=_plain, ensure_ascii=False)
            for i in range(0, len(delta), step)]


@dataclasses.dataclass(slots=True)
class _Waiter:
    """A row this replica received and waits for."""

    key: str
    run_id: str
    result: asyncio.Future
    relayed: int = 0  # events republished here


class _Relay:
    """Holder side of one claimed row: its run's events, gathered for the receiver."""

    def __init__(self, row: int) -> None:
        self.row = row
        self.pending: list[dict[str, Any]] = []
        self.flushing: asyncio.Task | None = None
        self.unsubscribe: Any = None
        self.now = asyncio.Event()  # the turn ended: send what is gathered at once


class TurnForwarding:
    """Both sides for one replica. ``db``: the ClusterDB (LISTEN registered at build);
    ``bus``: the gateway's EventBus (events of relayed runs are emitted on it)."""

    def __init__(self, db: Any, replica: str, bus: EventBus) -> None:
        self.db, self.me, self.bus = db, replica, bus
        self.waiting: dict[int, _Waiter] = {}
        self.relays: dict[int, _Relay] = {}
        self.forwarded = self.relayed = 0
        self._tasks: set[asyncio.Task] = set()
        db.listen(TURNS, self._on_notify)

    # -- receiver ------------------------------------------------------------------------
    async def insert(self, key: str, work: UserWork) -> int:
        """Write the row of ``work`` (sets ``work.journal_id``) and start waiting for it.
        Once, also when PostgreSQL's answer was lost after the commit (insert_once.py)."""
        payload = json.dumps(work_to_dict(work), ensure_ascii=False)
        row = await insert_row(self.db, key, payload, self.me, what="intake")
        work.journal_id = str(row)
        loop = asyncio.get_running_loop()
        self.waiting[row] = _Waiter(key, work.run_id, loop.create_future())
        return row

    def forget(self, row: int) -> None:
        self.waiting.pop(row, None)

    async def result(self, row: int) -> TurnResult:
        """The holder's TurnResult of row ``row`` (which :meth:`insert` wrote); an error
        result when none came within :data:`WAIT` seconds."""
        waiter = self.waiting[row]
        self.forwarded += 1
        loop = asyncio.get_running_loop()
        end = loop.time() + WAIT
        try:
            while loop.time() < end:
                try:
                    value = await asyncio.wait_for(asyncio.shield(waiter.result), POLL)
                except TimeoutError:
                    value = await self._read(row)
                if value is not None:
                    return decode_result(value, waiter.run_id, waiter.key)
        finally:
            self.forget(row)
        return TurnResult(waiter.run_id, waiter.key, "", "error", "", error=(
            "the replica running the session did not finish the turn in time"))

    async def _read(self, row: int) -> dict[str, Any] | None:
        got = await self.db.retry(lambda c: c.fetchrow(
            "SELECT state, work->'result' AS result FROM cluster_work WHERE id = $1", row),
            what="turn result")
        if got is None:
            return {"status": "error", "text": "", "error": "the message's row is gone"}
        if got["result"] is not None:
            return json.loads(got["result"])
        return None  # still running (or queued) somewhere

    def _on_notify(self, payload: str) -> None:
        try:
            msg = json.loads(payload)
            waiter = self.waiting.get(int(msg["row"]))
        except (ValueError, KeyError, TypeError):
            log.warning("cluster_turn_notify_invalid", payload=payload[:200])
            return
        if waiter is None or waiter.result.done():
            return
        for ev in msg.get("ev") or ():
            waiter.relayed += 1
            self.bus.emit(RuntimeEvent(ev["type"], waiter.run_id, waiter.key,
                                       ev.get("agent_id", ""), ev.get("ts", 0.0),
                                       ev.get("data") or {}))
        if "result" in msg:
            waiter.result.set_result(msg["result"])
        elif msg.get("done"):
            self._spawn_read(int(msg["row"]), waiter)

    def _spawn_read(self, row: int, waiter: _Waiter) -> None:
        async def read() -> None:
            value = await self._read(row)
            if value is not None and not waiter.result.done():
                waiter.result.set_result(value)
        task = asyncio.get_running_loop().create_task(read())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- holder --------------------------------------------------------------------------
    def claimed(self, row: int, work: Any) -> None:
        """A row of a waiting caller is about to run here (claimed from the queue): its
        events go to the receiver while the turn runs (only when the caller streams, and
        not when the receiver is this replica: its bus has them already)."""
        if not awaited(work):
            return
        relay = self.relays[row] = _Relay(row)
        if work.stream and row not in self.waiting:
            relay.unsubscribe = self.bus.subscribe(lambda ev: self._gather(relay, ev),
                                                   run_id=work.run_id)

    def relaying(self, row: int) -> bool:
        return row in self.relays

    def _gather(self, relay: _Relay, ev: RuntimeEvent) -> None:
        relay.pending.append(_event_json(ev))
        if relay.flushing is None or relay.flushing.done():
            relay.flushing = asyncio.get_running_loop().create_task(self._flush(relay))

    async def _flush(self, relay: _Relay) -> None:
        try:
            await asyncio.wait_for(relay.now.wait(), BATCH)
        except TimeoutError:
            pass
        while relay.pending:
            events, relay.pending = relay.pending, []
            for p in _payloads(relay.row, events):
                try:
                    await self.db.run(lambda c, p=p: c.execute(
                        "SELECT pg_notify($1, $2)", TURNS, p))
                    self.relayed += 1
                except (ClusterUnavailable, asyncpg.PostgresError) as exc:  # the result still comes: only deltas are lost
                    log.warning("cluster_turn_relay_failed", row=relay.row, error=str(exc))

    async def finish(self, row: int, fut: asyncio.Future) -> None:
        """The turn of row ``row`` settled here: the rest of its events, then its result
        into the row and to the receiver (fenced: only while the row is this replica's).
        Raises ClusterUnavailable only after the outage outlasted the retries."""
        relay = self.relays.get(row)
        if relay is not None and relay.unsubscribe is not None:
            relay.unsubscribe()
            relay.now.set()
            if relay.flushing is not None:
                await asyncio.gather(relay.flushing, return_exceptions=True)
            await self._flush(relay)
        value = json.dumps(encode_result(fut), default=_plain, ensure_ascii=False)
        note = f'{{"row": {row}, "result": {value}}}'
        if len(note.encode()) > NOTIFY_MAX:
            note = json.dumps({"row": row, "done": True})
        try:
            await self.db.retry(lambda c: _record(c, row, self.me, value, note),
                                what="turn result")
        finally:
            self.relays.pop(row, None)


async def _record(conn: asyncpg.Connection, row: int, me: str, value: str,
                  note: str) -> None:
    async with conn.transaction():
        done = await conn.fetchval(
            "UPDATE cluster_work SET work = work || jsonb_build_object('result', $2::jsonb) "
            "WHERE id = $1 AND target = $3 RETURNING id", row, value, me)
        if done is not None:
            await conn.execute("SELECT pg_notify($1, $2)", TURNS, note)
