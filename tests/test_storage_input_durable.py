"""On PostgreSQL the user's transcript line is committed before the model is called (issue
15 "nothing lost on a crash"; runtime/durability.py ``input_stored``), the guarantee the
embedded transcript gives by writing the file at the flush. The real gateway process, a
real PostgreSQL; the fake model, when a request arrives, looks the user's line up in
``transcript_lines`` from its own connection. The transcript INSERT is held up by a
table lock the test keeps, so a model call that does not wait for the commit is caught
every time, not only when the commit happens to be slow."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import asyncpg

from tests.cluster_harness import wait
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess, base_config


class CheckingModel(FakeOpenAI):
    """The fake model; for each request, whether the PostgreSQL transcript held the user
    text at that moment (``seen``: ``[(text, stored)]``)."""

    dsn = ""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.seen: list[tuple[str, bool]] = []

    async def _chat(self, request):
        text = self.last_user_text(await request.json())
        conn = await asyncpg.connect(self.dsn)
        try:
            stored = await conn.fetchval(
                "SELECT count(*) FROM transcript_lines WHERE line LIKE '%' || $1 || '%'",
                text)
        finally:
            await conn.close()
        self.seen.append((text, bool(stored)))
        return await super()._chat(request)


async def _lock_transcripts(dsn: str) -> asyncpg.Connection:
    """A connection holding SHARE on transcript_lines: INSERTs wait, reads go on."""
    conn = await asyncpg.connect(dsn)
    await conn.execute("BEGIN; LOCK TABLE transcript_lines IN SHARE MODE")
    return conn


async def _insert_waiting(dsn: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        return bool(await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
            "query LIKE 'INSERT INTO transcript_lines%'"))
    finally:
        await conn.close()


def test_the_user_line_is_committed_before_the_model_is_called(tmp_path, pg_dsn):
    CheckingModel.dsn = pg_dsn
    model = CheckingModel.start_in_thread()
    cfg = base_config(tmp_path / "state", model.base_url,
                      storage={"backend": "postgres", "dsn": pg_dsn})
    gp = GatewayProcess(tmp_path, cfg).start()
    loop = asyncio.new_event_loop()
    try:
        model.server.script_text("first answer")
        assert gp.agent("marker-one please")["reply"] == "first answer"
        lock = loop.run_until_complete(_lock_transcripts(pg_dsn))
        model.server.script_text("second answer")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reply = pool.submit(gp.agent, "marker-two please")
            wait(lambda: loop.run_until_complete(_insert_waiting(pg_dsn)), timeout=30,
                 what="the turn's transcript INSERT waiting on the lock")
            # a model call that does not wait for the commit arrives now
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and len(model.server.seen) < 2:
                time.sleep(0.05)
            loop.run_until_complete(lock.close())  # the INSERT goes through
            assert reply.result(60)["reply"] == "second answer"
        assert model.server.seen == [("marker-one please", True),
                                     ("marker-two please", True)]
    finally:
        assert gp.stop() == 0
        model.stop()
        loop.close()
