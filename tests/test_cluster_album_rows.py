"""With replicas, every part of a Telegram album is a ``cluster_work`` row, and the one
turn that answers the album finishes every part's row with one outcome each (docs/
outcomes.md: the parts of a media album share the turn's outcome, one row each). Real
PostgreSQL, the real gateway, the fake Telegram."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.channel_harness import chat_requests, until
from tests.cluster_harness import pg_query
from tests.helpers import running_gateway
from tests.test_media_albums import USER, photos, tg_config

pytestmark = pytest.mark.timeout(60)


async def test_an_album_on_replicas_finishes_every_part_row_with_one_outcome(
        tmp_path, model, tg, pg_dsn):
    cfg = tg_config(tmp_path / "state", model.base_url, tg.token, tg.url, "1s")
    cfg["storage"] = {"backend": "postgres", "dsn": pg_dsn}
    cfg["cluster"] = {"lease_ttl": "1s", "replica_id": "r1"}
    model.script_text("Nice photos.")
    async with running_gateway(cfg) as gw:
        for i, data in enumerate(photos(3)):
            tg.inject_media("photo", data, chat_id=USER, user_id=USER, media_group_id="g1",
                            caption="what is this?" if i == 0 else None)
        await until(lambda: tg.bot_messages(USER), what="the reply", timeout=15)
        rows = await pg_query(pg_dsn, "SELECT id FROM cluster_work ORDER BY id")
        assert len(rows) == 3

        async def all_done() -> bool:
            return await pg_query(pg_dsn, "SELECT count(*) FROM cluster_work WHERE "
                                          "state <> 'done'") == [(0,)]
        deadline = time.monotonic() + 10
        while not await all_done():
            assert time.monotonic() < deadline, await pg_query(
                pg_dsn, "SELECT id, state, started FROM cluster_work ORDER BY id")
            await asyncio.sleep(0.05)  # polling the rows, bounded by the deadline
        outcomes = [r for r in gw.journal.outcomes.rows.values()
                    if r.get("channel") == "telegram"]
    assert len(chat_requests(model)) == 1
    assert sorted(str(r["id"]) for r in outcomes) == sorted(str(r[0]) for r in rows), outcomes
