"""With replicas, the rows of one turn (messages merged by ``collect`` or steered in:
they share the turn's run id) taken over from a dead replica are run again as that one
turn, as a restart resumes them on one host (tests/test_resume_merged_turn.py): one model
turn, one restart notice (when side-effecting tools had begun), one reply, one outcome
for each row. Before, each row was started on its own and
the second ran a turn of its own. Real PostgreSQL, the real gateway."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gateway.journal.resume import INTERRUPTED_NOTICE
from tests.channel_harness import chat_requests
from tests.cluster_harness import pg_query
from tests.helpers import base_config, running_gateway

KEY = "agent:main:telegram:dm:8"


@pytest.mark.parametrize("mode,tools", [("followup", []), ("collect", []),
                                        ("steer", ["exec"])])
async def test_the_taken_over_rows_of_one_turn_run_as_one_turn(tmp_path, fake_model,
                                                                pg_dsn, tg, mode, tools):
    cfg = base_config(tmp_path / "state", fake_model.base_url,
                      storage={"backend": "postgres", "dsn": pg_dsn},
                      cluster={"lease_ttl": "1s", "replica_id": "r1"},
                      messages={"queue": {"mode": mode, "debounce": 0}},
                      channels={"telegram": {"enabled": True, "token": tg.token,
                                             "api_base_url": f"{tg.url}/bot",
                                             "poll_timeout": 1, "dm_policy": "open"}})
    fake_model.server.script_text("Both answered.")
    fake_model.server.script_text("A SECOND TURN")
    async with running_gateway(cfg) as gw:
        await pg_query(pg_dsn, "INSERT INTO cluster_replicas (id, host, pid, heartbeat_at) "
                               "VALUES ('dead', 'h', 2, now() - interval '1 hour')")
        rows = []
        for n, text in enumerate(("start the build", "and tell me when done")):
            work = json.dumps({"agent_id": "main", "text": text, "channel": "telegram",
                               "account_id": "default", "chat_type": "dm",
                               "sender_id": "8", "message_id": f"8{n}", "received_at": 0,
                               "run_id": f"run-{n}", "route": {
                                   "channel": "telegram", "account": "default", "to": "8",
                                   "thread": None}})
            rows.append((await pg_query(
                pg_dsn, "INSERT INTO cluster_work (session_key, work, target, state, "
                        "started, attempts, run_id, tools) VALUES ($1, $2, 'dead', "
                        "'running', true, 1, 'run-dead', $3) RETURNING id", KEY, work,
                tools))[0][0])
        deadline = time.monotonic() + 20
        while (await pg_query(pg_dsn, "SELECT count(*) FROM cluster_work WHERE "
                                      "id = ANY($1::bigint[]) AND state = 'done'", rows)
               ) != [(2,)]:
            assert time.monotonic() < deadline, "the rows were not run here"
            await asyncio.sleep(0.05)  # polling the rows, bounded by the deadline
        await asyncio.sleep(0.3)  # a second turn, if any, would call the model now
        outcomes = [r["outcome"] for r in gw.journal.outcomes.rows.values()
                    if r.get("session_key") == KEY]
    assert len(chat_requests(fake_model.server)) == 1
    notice = [INTERRUPTED_NOTICE] if tools else []  # one for the turn, not per row
    assert [m["text"] for m in tg.bot_messages(8)] == [*notice, "Both answered."]
    want = "interrupted" if tools else "replied"
    assert outcomes == [want, want], outcomes
