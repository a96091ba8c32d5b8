"""What a restart after kill -9 does with PostgreSQL storage, found by the fault-injection
run (tests/fault_injection/) and pinned here on a real PostgreSQL, with rows written the
way a replica writes them and the takeover's and routing's own transactions:

- dead letters (gateway/cluster/crashes.py): work rows taken over from a process that
  died count the crash of their attempt; the third same crash in a row sets the message
  aside instead of replaying it at every start; a turn that merely ran beside the one
  that took the process down is not charged, nor are turns killed together while none
  was in a side-effecting tool (a kill -9 from outside). Before, a poison message in
  ``cluster_work`` was replayed by every takeover and took each restarted process down,
  for ever;
- a session's order: older rows a takeover queued for this replica start before a new
  message of their session (gateway/cluster/adopt.py ``queued_before``);
- a reply cut by the kill is resolved only when its message has no outcome yet;
- ``sessions outcomes`` keeps an outcome whose timeline event a kill -9 lost (the
  replica's own journal rows complete the shared list)."""

from __future__ import annotations

import json

import asyncpg
import pytest

from gateway.cluster import takeover
from gateway.journal.recorder import OutcomeRecorder
from gateway.journal.store import IntakeJournal
from runtime.clock import FakeClock
from runtime.storage.config import StorageSection
from runtime.storage.postgres.pool import open_database

pytestmark = pytest.mark.timeout(60)


async def _db(dsn: str) -> asyncpg.Connection:
    pool = await open_database(StorageSection(backend="postgres", dsn=dsn))  # migrates
    await pool.close()
    conn = await asyncpg.connect(dsn)
    await conn.execute("INSERT INTO cluster_replicas (id, host, pid, heartbeat_at) VALUES "
                       "('r1', 'h', 1, now()), ('dead', 'h', 2, now() - interval '1 hour')")
    return conn


async def _row(conn, key: str, *, started: bool, tools=(), crashes=(), attempt_from=0) -> int:
    work = json.dumps({"agent_id": "main", "text": key, "channel": "telegram",
                       "message_id": "7", "received_at": 0})
    return await conn.fetchval(
        "INSERT INTO cluster_work (session_key, work, target, state, started, attempts, "
        "tools, crashes, attempt_from) VALUES ($1, $2, 'dead', 'running', $3, $4, $5, $6, "
        "$7) RETURNING id", key, work, started, int(started), list(tools), list(crashes),
        attempt_from)


async def _state(conn, rid: int) -> tuple:
    r = await conn.fetchrow("SELECT state, crashes, attempts_seen, attempt_from, target FROM "
                            "cluster_work WHERE id = $1", rid)
    return r["state"], list(r["crashes"]), r["attempts_seen"], r["attempt_from"], r["target"]


async def test_the_third_same_crash_sets_the_row_aside_and_bystanders_are_not_charged(
        pg_dsn):
    conn = await _db(pg_dsn)
    try:
        poison = await _row(conn, "agent:main:telegram:dm:1", started=True,
                            tools=["exec", "exec", "exec"],
                            crashes=["tool:exec", "tool:exec"], attempt_from=2)
        beside = await _row(conn, "agent:main:telegram:dm:2", started=True)
        queued = await _row(conn, "agent:main:telegram:dm:3", started=False)
        handled, letters = await takeover.orphans(conn, "r1", 3.0)
        assert [(r["id"], c) for r, c in letters] == [
            (poison, ["tool:exec", "tool:exec", "tool:exec"])]
        assert {r["id"] for r in handled} == {beside, queued}  # requeued, run again
        assert (await _state(conn, poison))[:2] == ("done", ["tool:exec"] * 3)
        # the turn beside it: a new attempt, no crash charged
        assert await _state(conn, beside) == ("queued", [], 1, 0, "r1")
        assert (await _state(conn, queued))[:2] == ("queued", [])
    finally:
        await conn.close()


async def test_a_crash_is_counted_even_before_the_batched_started_mark_was_written(
        pg_dsn):
    """The ``started`` mark is batched; the side-effecting tool's mark is awaited before
    the tool runs. A process that died in the tool left ``started = false`` and the tool
    in ``tools``: that attempt had begun, and it counts."""
    conn = await _db(pg_dsn)
    try:
        rid = await _row(conn, "agent:main:telegram:dm:1", started=False, tools=["exec"])
        handled, letters = await takeover.orphans(conn, "r1", 3.0)
        assert letters == [] and [r["id"] for r in handled] == [rid]
        assert await _state(conn, rid) == ("queued", ["tool:exec"], 0, 1, "r1")
        # two more attempts die the same way: the third takeover sets it aside
        for n in (2, 3):
            await conn.execute("UPDATE cluster_work SET target = 'dead', state = 'running',"
                               " started = true, attempts = attempts + 1, "
                               "tools = array_append(tools, 'exec') WHERE id = $1", rid)
            handled, letters = await takeover.orphans(conn, "r1", 3.0)
        assert [c for _, c in letters] == [["tool:exec"] * 3] and handled == []
    finally:
        await conn.close()


async def _dies_again(conn, rid: int, *tools: str) -> None:
    """The restarted process (``dead`` again by the next takeover) ran row ``rid`` again:
    a new attempt, with the side-effecting ``tools`` it began."""
    await conn.execute("UPDATE cluster_work SET target = 'dead', state = 'running', "
                       "started = true, attempts = attempts + 1, tools = tools || $2 "
                       "WHERE id = $1", rid, list(tools))


async def test_kill9_with_two_turns_in_the_model_three_times_sets_nothing_aside(pg_dsn):
    """A kill -9 (not a turn's doing) while two turns waited on the model, three times:
    neither is charged, both run again; before, each death counted ``turn`` for both and
    the third set two innocent messages aside."""
    conn = await _db(pg_dsn)
    try:
        a = await _row(conn, "agent:main:discord:dm:1", started=True)
        b = await _row(conn, "agent:main:slack:dm:2", started=True)
        for death in range(3):
            if death:
                await _dies_again(conn, a)
                await _dies_again(conn, b)
            handled, letters = await takeover.orphans(conn, "r1", 3.0)
            assert letters == [] and {r["id"] for r in handled} == {a, b}
        assert [(await _state(conn, i))[:3] for i in (a, b)] == [("queued", [], 3)] * 2
    finally:
        await conn.close()


async def test_a_turn_dying_alone_three_times_or_in_a_tool_beside_others_is_set_aside(
        pg_dsn):
    """The poison cases still end: a turn that was the only one running at each death,
    and a turn that died in ``exec`` each time while two others waited on the model."""
    conn = await _db(pg_dsn)
    try:
        alone = await _row(conn, "agent:main:telegram:dm:1", started=True)
        for death in range(3):
            if death:
                await _dies_again(conn, alone)
            _handled, letters = await takeover.orphans(conn, "r1", 3.0)
        assert [(r["id"], c) for r, c in letters] == [(alone, ["turn"] * 3)]
        poison = await _row(conn, "agent:main:telegram:dm:2", started=True, tools=["exec"])
        beside = [await _row(conn, f"agent:main:slack:dm:{n}", started=True) for n in (3, 4)]
        for death in range(3):
            if death:
                await _dies_again(conn, poison, "exec")
                for r in beside:
                    await _dies_again(conn, r)
            _handled, letters = await takeover.orphans(conn, "r1", 3.0)
        assert [(r["id"], c) for r, c in letters] == [(poison, ["tool:exec"] * 3)]
        assert [(await _state(conn, i))[:2] for i in beside] == [("queued", [])] * 2
    finally:
        await conn.close()


async def _route_alone(conn, key: str) -> list:
    """What routing a new message of session ``key`` does with its rows of a dead
    process (adopt.py, in the routing transaction): the dead letters."""
    from gateway.cluster import adopt
    async with conn.transaction():
        rows = await adopt.lock_dead_rows(conn, key, 10**9, "r1", 3.0)
        letters, _rest = await adopt.set_aside(conn, rows)
    return letters


async def test_a_death_routed_session_by_session_is_charged_as_one(pg_dsn):
    """After a restart, new messages route their session's rows of the previous life one
    session at a time (before the periodic takeover; ``rejoin`` left them without an
    owner): the whole death counts at the first, so the last session routed is not
    taken for the one turn that ran, and a poison in another session is still charged."""
    from gateway.cluster import membership
    conn = await _db(pg_dsn)
    try:
        a = await _row(conn, "agent:main:discord:dm:1", started=True, crashes=["turn"] * 2)
        b = await _row(conn, "agent:main:slack:dm:2", started=True, crashes=["turn"] * 2)
        await conn.execute("UPDATE cluster_work SET target = 'r1'")
        await membership.rejoin(conn, "r1", None)  # the same replica id, restarted
        assert await _route_alone(conn, "agent:main:discord:dm:1") == []
        assert await _route_alone(conn, "agent:main:slack:dm:2") == []
        assert [(await _state(conn, i))[1:3] for i in (a, b)] == [(["turn"] * 2, 1)] * 2
        # the next life: a turn in the model, the poison in exec in another session
        await _dies_again(conn, a)
        poison = await _row(conn, "agent:main:telegram:dm:3", started=True,
                            tools=["exec"], crashes=["tool:exec"] * 2)
        letters = await _route_alone(conn, "agent:main:discord:dm:1")
        assert [(r["id"], c) for r, c in letters] == [(poison, ["tool:exec"] * 3)]
        assert (await _state(conn, a))[:3] == ("running", ["turn"] * 2, 2)
    finally:
        await conn.close()


def test_a_dead_letter_of_a_work_row_is_kept_in_the_replica_journal(tmp_path):
    """The taking replica records the row's outcome in its own journal (the entry is in
    PostgreSQL): ``dead-letters list`` there shows the message and its crashes."""
    journal = IntakeJournal(tmp_path / "j.jsonl", FakeClock(1000.0))
    journal.load()
    rec = OutcomeRecorder(FakeClock(1000.0), journal)
    work = {"agent_id": "main", "text": "poison", "channel": "telegram", "message_id": "7"}
    rec.record_message({"journal_id": "42", "channel": "telegram", "message_id": "7",
                        "agent": "main", "work": work, "crashes": ["turn"] * 3},
                       "dead-lettered", "set aside", session_key="agent:main:telegram:dm:1")
    journal.close()
    again = IntakeJournal(tmp_path / "j.jsonl", FakeClock(1000.0))
    again.load()
    assert again.outcomes.dead["42"]["work"]["text"] == "poison"
    assert again.outcomes.dead["42"]["crashes"] == ["turn"] * 3


async def test_a_new_message_runs_after_the_older_rows_a_takeover_queued_for_this_replica(
        pg_dsn):
    """Right after a restart the takeover requeues the dead process's rows for the lane's
    new holder, this replica, and the claim starts them a moment later. A message of the
    same session routed in between ran first: the interrupted row was then re-run on a
    transcript already ending with the newer message and answered that one a second time
    (the fault-injection run: one chat showed the newer reply twice, the older message
    none). Routing now starts those queued older rows first, as after a restart on one
    host."""
    from gateway.cluster.db import ClusterDB
    from gateway.cluster.work import ClusterWork
    conn = await _db(pg_dsn)
    db = ClusterDB(pg_dsn)
    try:
        key = "agent:main:telegram:dm:1"
        old = await _row(conn, key, started=True)
        await takeover.orphans(conn, "r1", 3.0)  # requeued for r1, which takes the lane
        assert (await _state(conn, old))[0] == "queued"
        new = await _row(conn, key, started=False)
        work = ClusterWork(db, "r1", 3.0, None, side_effecting=lambda t: True,
                           debounce=lambda *a: 0.0)
        got = await db.run(lambda c: work._assign_rows(c, key, [new]))
        assert got.holder == "r1"
        assert [r["id"] for r in got.adopted] == [old]  # started before the new one
        assert (await _state(conn, old))[0] == "running"
    finally:
        await db.close()
        await conn.close()


def test_the_outcome_list_keeps_own_rows_whose_timeline_event_was_lost():
    """The outcome of a local message (the caller had its answer) is in the replica's
    journal at once and in the shared timeline a moment later; a kill -9 in between lost
    the event: the API's list (what ``tidegate sessions outcomes`` prints) still has it,
    once, and the shared rows, also those of other replicas, stay."""
    from gateway.server.outcomes_api import merged
    shared = [{"id": "7", "ts": 10.0, "outcome": "replied"},
              {"id": "9", "ts": 30.0, "outcome": "failed"}]  # another replica's
    own = [{"id": "7", "ts": 10.0, "outcome": "replied", "local": True},
           {"id": "8", "ts": 20.0, "outcome": "replied", "local": True}]  # event lost
    assert [r["id"] for r in merged(shared, own, None)] == ["7", "8", "9"]
    assert [r["id"] for r in merged(shared, own, 2)] == ["8", "9"]
    assert merged(None, own, None) == own  # PostgreSQL unreachable: the own rows


async def _outcome_event(conn, key: str, entry_id: int) -> None:
    await conn.execute("INSERT INTO timelines (session_id, session_key, status, created_at, "
                       "last_seq, last_hash, last_timestamp) VALUES ('s1', $1, 'active', 0, "
                       "0, 'h0', 0)", key)
    content = json.dumps({"outcome": "replied", "detail": "", "message_id": "7",
                          "channel": "telegram", "entry_id": str(entry_id), "run_id": "r"})
    await conn.execute("INSERT INTO timeline_events (event_id, session_id, seq, \"timestamp\","
                       " event_type, content, prev_hash, hash) VALUES ('e1', 's1', 1, 1, "
                       "'OUTCOME', $1, 'h0', 'h1')", content)


async def test_a_taken_over_row_whose_message_has_its_outcome_is_not_run_again(pg_dsn):
    """The outcome is written at once, the row's done mark is batched: a kill -9 in
    between left a finished message's row open, and the takeover ran its turn a second
    time (two ``replied`` rows for one Discord message; the platform deduplicated the
    reply). A row whose message's ``OUTCOME`` is in the shared timeline, or in this
    replica's journal, is now marked done instead."""
    from gateway.cluster.db import ClusterDB
    from gateway.cluster.work import ClusterWork
    conn = await _db(pg_dsn)
    db = ClusterDB(pg_dsn)
    try:
        key = "agent:main:discord:dm:1"
        ended = await _row(conn, key, started=True)
        await _outcome_event(conn, key, ended)
        own = await _row(conn, "agent:main:discord:dm:2", started=True)
        other = await _row(conn, "agent:main:discord:dm:3", started=True)
        handled, _ = await takeover.orphans(conn, "r1", 3.0)
        work = ClusterWork(db, "r1", 3.0, None, side_effecting=lambda t: True,
                           debounce=lambda *a: 0.0)
        work.outcome_known = lambda i: i == str(own)  # in this replica's journal
        assert await takeover.ended(work, next(r for r in handled if r["id"] == ended))
        assert await takeover.ended(work, next(r for r in handled if r["id"] == own))
        assert not await takeover.ended(work, next(r for r in handled if r["id"] == other))
        await work.close()  # the batched done marks are written
        assert [(await _state(conn, i))[0] for i in (ended, own, other)] == [
            "done", "done", "queued"]
    finally:
        await db.close()
        await conn.close()


async def test_a_cut_reply_whose_message_has_its_outcome_is_not_resolved_again(pg_dsn):
    """The reply was sent and the outcome recorded, but a kill -9 lost the row's batched
    done mark: the row still says its reply had begun. The takeover used to resolve it
    (the platform's unknown-outcome resend) and record a second ``replied`` for the one
    Discord message; only the replies of messages without an outcome are resolved now."""
    from gateway.cluster.db import ClusterDB
    from gateway.cluster.work import ClusterWork
    conn = await _db(pg_dsn)
    db = ClusterDB(pg_dsn)
    try:
        key = "agent:main:discord:dm:1"
        ended, own, cut = [await _row(conn, f"{key}{n}", started=True) for n in (1, 2, 3)]
        await _outcome_event(conn, f"{key}1", ended)
        await conn.execute("UPDATE cluster_work SET replying = true, reply = jsonb_build_object("
                           "'text', 'hi', 'key', id::text, 'ts', 1)")
        work = ClusterWork(db, "r1", 3.0, None, side_effecting=lambda t: True,
                           debounce=lambda *a: 0.0)
        work.outcome_known = lambda i: i == str(own)  # in this replica's journal
        resolved: list[int] = []

        async def on_reply_cut(_key, _work, _reply, row: int) -> None:
            resolved.append(row)
        work.on_reply_cut = on_reply_cut
        assert await work.take_over() == 3
        await work.close()
        assert resolved == [cut]
        assert [(await _state(conn, i))[0] for i in (ended, own, cut)] == ["done"] * 3
    finally:
        await db.close()
        await conn.close()


async def test_a_merged_turn_dying_alone_is_charged_as_one_turn_like_the_journal(pg_dsn):
    """Two messages merged into one turn (collect, steer, an album) are one turn: their
    started mark writes the turn's run id on both rows, and a death while that turn ran
    alone is charged to both, as the intake journal does (tests/test_dead_letter_charging
    .py); before, the two rows counted as two turns and a merged poison was never set
    aside. Two turns of their own (different run ids) are still charged to none."""
    from gateway.cluster.fencing import write_marks
    conn = await _db(pg_dsn)
    try:
        key = "agent:main:telegram:dm:1"
        merged = [await _row(conn, key, started=False) for _ in range(2)]
        for death in range(3):
            await conn.execute("UPDATE cluster_work SET target = 'dead', state = 'running' "
                               "WHERE id = ANY($1::bigint[])", merged)
            assert await write_marks(conn, {"started": merged}, "dead",
                                     dict.fromkeys(merged, f"run-{death}")) == set()
            _handled, letters = await takeover.orphans(conn, "r1", 3.0)
        assert sorted((r["id"], c) for r, c in letters) == [(i, ["turn"] * 3) for i in merged]
        a = await _row(conn, "agent:main:slack:dm:2", started=False)
        b = await _row(conn, "agent:main:slack:dm:3", started=False)
        await write_marks(conn, {"started": [a, b]}, "dead", {a: "run-a", b: "run-b"})
        _handled, letters = await takeover.orphans(conn, "r1", 3.0)
        assert letters == [] and [(await _state(conn, i))[1] for i in (a, b)] == [[], []]
    finally:
        await conn.close()
