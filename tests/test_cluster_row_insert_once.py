"""A waiting caller's message (webchat, the OpenAI API, the CLI, the control API) and a
session command become ONE ``cluster_work`` row each, even when the insert's answer is
lost after it committed (PostgreSQL stopped, the connection cut): the retry finds the row
written before instead of writing a second one, which a restart's takeover would run as a
second turn with a second outcome (the fault-injection run's ``outcome-twice`` of a
``lost`` webchat/OpenAI message). Real PostgreSQL; tests/pg_cut_proxy.py loses the answer.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.cluster import membership
from gateway.cluster.db import ClusterDB
from gateway.cluster.forwarding import TurnForwarding
from gateway.cluster.work import ClusterWork
from gateway.turns.work import CommandWork, UserWork
from runtime.events import EventBus
from runtime.lanes import LaneManager
from runtime.storage.config import StorageSection
from runtime.storage.postgres.pool import open_database
from tests.pg_cut_proxy import CutProxy

KEY = "agent:main:webchat:dm:fi-m84"


@pytest.fixture
def cut(pg_server):
    p = CutProxy(lambda: pg_server.port).start()
    yield p
    p.close()


async def _rows(db: ClusterDB) -> list[dict]:
    return [dict(r) for r in await db.run(lambda c: c.fetch(
        "SELECT id, dedupe, work FROM cluster_work WHERE session_key = $1 ORDER BY id", KEY))]


async def test_a_forwarded_message_whose_insert_answer_was_lost_has_one_row(pg_dsn, cut):
    await (await open_database(StorageSection(backend="postgres", dsn=pg_dsn))).close()
    db = ClusterDB(cut.dsn(pg_dsn))
    fwd = TurnForwarding(db, "r1", EventBus())
    try:
        await db.run(lambda c: c.fetchval("SELECT 1"))  # connected before the fault
        work = UserWork(agent_id="main", text="fi-m84 hello", channel="webchat",
                        sender_id="fi-m84")
        cut.arm(b"INSERT INTO cluster_work")
        row = await asyncio.wait_for(fwd.insert(KEY, work), 8)
        assert cut.cuts == 1  # the first answer was lost: the insert was retried
        rows = await _rows(db)
        assert [r["id"] for r in rows] == [row]  # the committed row, not a second one
        assert work.journal_id == str(row)
        assert json.loads(rows[0]["work"])["run_id"] == work.run_id
        # a second message of the same session is a row of its own
        other = UserWork(agent_id="main", text="fi-m84 again", channel="webchat",
                         sender_id="fi-m84")
        assert await fwd.insert(KEY, other) != row
        assert len(await _rows(db)) == 2
    finally:
        await db.close()


async def test_a_session_command_whose_insert_answer_was_lost_has_one_row(pg_dsn, cut):
    await (await open_database(StorageSection(backend="postgres", dsn=pg_dsn))).close()
    db = ClusterDB(cut.dsn(pg_dsn))
    ran: list = []

    async def runner(key, works, control):
        ran.extend(works)
    lanes = LaneManager(runner, mode="followup", debounce=0)
    work = ClusterWork(db, "r1", 3.0, lanes, side_effecting=lambda t: False,
                       debounce=lambda *a: 0)
    try:
        await db.run(lambda c: membership.beat(c, "r1", None))
        cmd = CommandWork(agent_id="main", command="new", channel="webchat")
        cut.arm(b"INSERT INTO cluster_work")
        await asyncio.wait_for(work.submit(KEY, cmd, {"mergeable": False}), 8)
        assert cut.cuts == 1
        assert ran == [cmd]  # run once, here (this replica took the lane)
        rows = await _rows(db)
        assert [str(r["id"]) for r in rows] == [cmd.journal_id]
    finally:
        await asyncio.wait_for(work.close(), 10)
        lanes.close()
        await db.close()


async def test_a_platform_message_whose_accept_answer_was_lost_is_accepted_once(pg_dsn,
                                                                                cut):
    """The retried accept finds its own row (same message, same run id) instead of taking
    it for a redelivery: the message is not dropped as a duplicate of itself, with its
    row left unrun. A real redelivery (a new run id) is still a duplicate."""
    await (await open_database(StorageSection(backend="postgres", dsn=pg_dsn))).close()
    db = ClusterDB(cut.dsn(pg_dsn))
    work = ClusterWork(db, "r1", 3.0, None, side_effecting=lambda t: False,
                       debounce=lambda *a: 0)
    key = "agent:main:telegram:dm:1"

    def msg() -> UserWork:
        return UserWork(agent_id="main", text="hi", channel="telegram", account_id="bot0",
                        chat_type="dm", sender_id="1", message_id="42")
    try:
        await db.run(lambda c: c.fetchval("SELECT 1"))
        first = msg()
        cut.arm(b"INSERT INTO cluster_work")
        assert await asyncio.wait_for(work.accept(key, first, "tg:42"), 8)
        assert cut.cuts == 1
        rows = await db.run(lambda c: c.fetch(
            "SELECT id FROM cluster_work WHERE dedupe = 'tg:42'"))
        assert [str(r["id"]) for r in rows] == [first.journal_id]
        again = msg()  # the platform delivers the same message once more
        assert not await work.accept(key, again, "tg:42")
        assert again.journal_id is None
    finally:
        await asyncio.wait_for(work.close(), 10)
        await db.close()
