"""A dead replica's begun turn, taken over and re-run here, on a real PostgreSQL with the
real gateway (gateway/cluster/work.py ``_start_row``, gateway/turns/executor.py):

- its row gets its one outcome however the re-run turn ends (docs/outcomes.md): here the
  turn raises, its transcript cannot be read (the table is gone). Before, the row was
  marked done and no outcome was recorded, nothing was logged: the message vanished (as
  in the fault-injection replay, a Discord message re-run just as PostgreSQL stopped);
- the re-run turn's look-up of what its transcript holds already (its message, a final
  answer) waits off the event loop: no blocking bridge call from the loop
  (``SyncBridge.loop_calls``), as for every other turn (tests/test_storage_nonblocking.py).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.cluster_harness import pg_query
from tests.helpers import base_config, running_gateway

KEY = "agent:main:telegram:dm:7"


@pytest.fixture
async def gateway(tmp_path, fake_model, pg_dsn):
    cfg = base_config(tmp_path / "state", fake_model.base_url,
                      storage={"backend": "postgres", "dsn": pg_dsn},
                      cluster={"lease_ttl": "1s", "replica_id": "r1"})
    async with running_gateway(cfg) as gw:
        yield gw


async def _dead_replicas_begun_turn(dsn: str) -> int:
    """A replica that died an hour ago in the middle of a turn: its row's id."""
    await pg_query(dsn, "INSERT INTO cluster_replicas (id, host, pid, heartbeat_at) "
                        "VALUES ('dead', 'h', 2, now() - interval '1 hour')")
    work = json.dumps({"agent_id": "main", "text": "hello", "channel": "telegram",
                       "account_id": "default", "chat_type": "dm", "sender_id": "7",
                       "message_id": "41", "received_at": 0})
    return (await pg_query(dsn, "INSERT INTO cluster_work (session_key, work, target, "
                                "state, started, attempts) VALUES ($1, $2, 'dead', "
                                "'running', true, 1) RETURNING id", KEY, work))[0][0]


async def _until_done_here(dsn: str, row: int) -> None:
    deadline = time.monotonic() + 20
    while (got := await pg_query(dsn, "SELECT state, target FROM cluster_work WHERE id = $1",
                                 row)) != [("done", "r1")]:
        assert time.monotonic() < deadline, f"row {row} still {got}"
        await asyncio.sleep(0.05)  # polling the row, bounded by the deadline


def _outcomes(gw) -> list[dict]:
    return [r for r in gw.journal.outcomes.rows.values() if r.get("message_id") == "41"]


async def test_a_taken_over_turn_that_raises_still_gets_its_outcome(gateway, pg_dsn):
    await pg_query(pg_dsn, "ALTER TABLE transcript_lines RENAME TO transcript_lines_gone")
    await _until_done_here(pg_dsn, await _dead_replicas_begun_turn(pg_dsn))
    outcomes = _outcomes(gateway)
    assert [r["outcome"] for r in outcomes] == ["failed"], outcomes
    assert "transcript_lines" in outcomes[0]["detail"]


async def test_a_taken_over_turn_reads_its_transcript_off_the_loop(gateway, pg_dsn,
                                                                    fake_model):
    from gateway.service.storage import bridge
    door = bridge(gateway)
    before = door.loop_calls
    fake_model.server.script_text("answered again")
    await _until_done_here(pg_dsn, await _dead_replicas_begun_turn(pg_dsn))
    assert [r["outcome"] for r in _outcomes(gateway)] == ["replied"]
    assert door.loop_calls == before, "blocking PostgreSQL calls on the event loop"
