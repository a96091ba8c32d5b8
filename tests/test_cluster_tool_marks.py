"""On PostgreSQL (replicas) a side-effecting tool's mark is in its work row before the
tool runs (issue 15 "A replica dying mid-run ... never silently doubled"; README
"Delivery guarantees"): a replica taking the row over then continues the turn instead of
re-running it blindly. The real gateway process and a real PostgreSQL; the fake model,
when it answers with the ``exec`` call, locks the turn's work row from its own
connection, so a tool that runs before its mark is committed is caught every time."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from tests.cluster_harness import wait
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import start_in_thread
from tests.helpers import GatewayProcess, base_config

USER = 4242


class LockingModel(FakeOpenAI):
    """The fake model; at its first request it locks every ``cluster_work`` row (FOR
    UPDATE, in a transaction it keeps) before answering. ``release()`` ends it."""

    dsn = ""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.lock: asyncpg.Connection | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def _chat(self, request):
        if self.lock is None:
            self.loop = asyncio.get_running_loop()
            self.lock = await asyncpg.connect(self.dsn)
            await self.lock.execute("BEGIN")
            await self.lock.execute("SELECT 1 FROM cluster_work FOR UPDATE")
        return await super()._chat(request)

    def release(self) -> None:
        assert self.lock is not None and self.loop is not None
        asyncio.run_coroutine_threadsafe(self.lock.close(), self.loop).result(10)


async def _query(dsn: str, sql: str):
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def test_a_side_effecting_tool_runs_only_after_its_mark_is_committed(tmp_path, pg_dsn):
    LockingModel.dsn = pg_dsn
    model = LockingModel.start_in_thread()
    tg = start_in_thread()
    telegram = {"enabled": True, "token": tg.fake.token, "api_base_url": f"{tg.url}/bot",
                "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
    cfg = base_config(tmp_path / "state", model.base_url, channels={"telegram": telegram},
                      storage={"backend": "postgres", "dsn": pg_dsn})
    gp = GatewayProcess(tmp_path, cfg).start()
    ran = tmp_path / "state" / "workspace" / "ran.txt"
    loop = asyncio.new_event_loop()
    try:
        model.server.push({"type": "tool_calls", "calls": [
            {"name": "exec", "arguments": {"command": f"touch {ran}"}}]})
        model.server.script_text("touched")
        # a platform message: its work row is the turn's journal entry
        tg.call(tg.fake.inject_message, "touch the file please", chat_id=USER,
                user_id=USER)
        wait(lambda: loop.run_until_complete(_query(pg_dsn, (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'UPDATE cluster_work SET tools%'"))), timeout=30,
             what="the exec mark waiting on the row lock")
        # a tool that does not wait for its mark runs now
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not ran.exists():
            time.sleep(0.05)
        assert not ran.exists(), "exec ran before its mark was committed"
        model.server.release()
        wait(lambda: tg.call(tg.fake.bot_messages, USER), timeout=30, what="the reply")
        assert tg.call(tg.fake.bot_messages, USER)[-1]["text"] == "touched"
        assert ran.exists()
        tools = loop.run_until_complete(_query(
            pg_dsn, "SELECT array_agg(t) FROM cluster_work, unnest(tools) t"))
        assert tools == ["exec"]
        # the turn the row ran in (its started and tool marks write it: crashes.py)
        assert loop.run_until_complete(_query(
            pg_dsn, "SELECT count(*) FROM cluster_work WHERE run_id IS NOT NULL")) == 1
    finally:
        assert gp.stop() == 0
        model.stop()
        tg.stop()
        loop.close()
