"""The outbox on both storage backends (issue 15): queued replies survive a restart,
delivered ones go, given-up ones become dead letters, a store that refuses a write (a
PostgreSQL outage, a broken directory) loses nothing: the write is retried until it
lands. PostgreSQL: a dead replica's entries are adopted by another, exactly once."""

from __future__ import annotations

import asyncio
import json
import os

from channels.base import DeliveryResult, OutboundMessage
from channels.outbound.outbox import Outbox
from gateway.cluster import membership
from runtime.clock import FakeClock
from runtime.storage.embedded.outbox_spill import write_spill
from tests.cluster_harness import until
from tests.storage_backends import pg_query


def msg(text: str = "hello") -> OutboundMessage:
    return OutboundMessage(channel="telegram", to="123", text=text, session_key="agent:a:main")


async def _outbox(backend, clock, **kw) -> Outbox:
    records = await backend.records("outbox")
    return await asyncio.to_thread(Outbox, backend.tmp / "outbox" if backend.name ==
                                   "embedded" else None, clock, records=records, **kw)


async def test_entries_survive_a_restart_and_delivered_ones_go(backend):
    clock = FakeClock()
    ob = await _outbox(backend, clock)
    one = ob.put(msg("one"), "timeout")
    two = ob.put(msg("two"), "timeout")
    assert await asyncio.to_thread(ob.flush) == 0  # what shutdown does: all stored
    again = await _outbox(backend, clock)
    assert again.pending() == 2
    assert [e.message.text for e in again.due(clock.time() + 5)] == ["one", "two"]
    assert again.due(clock.time() + 4.9) == []
    again.mark_sent(one)
    await again._flush_writes()
    third = await _outbox(backend, clock)
    assert [e.id for e in third.due(clock.time() + 5)] == [two]


async def test_run_retries_then_dead_letters_and_both_stick(backend):
    clock = FakeClock()
    ob = await _outbox(backend, clock, max_attempts=3)
    sent: list[str] = []

    async def send(m):
        sent.append(m.text)
        return DeliveryResult(ok=False, error="down", retryable=True)

    stop = asyncio.Event()
    task = asyncio.create_task(ob.run(send, stop))
    eid = ob.put(msg("x"), "first failure")
    for _ in range(3):
        await clock.advance(31)
        await asyncio.sleep(0.05)
    await until(lambda: ob.pending() == 0 and ob.unsaved() == 0, "dead letter stored")
    stop.set()
    await task
    assert sent == ["x", "x"]  # attempts 2 and 3, then given up
    assert (await _outbox(backend, clock)).pending() == 0
    if backend.name == "embedded":
        assert os.path.exists(backend.tmp / "outbox" / "dead" / f"{eid}.json")
    else:
        assert await backend.raw("SELECT id, dead FROM outbox") == [(eid, True)]


async def _break(backend) -> None:
    if backend.name == "embedded":  # the directory is replaced by a file: writes fail
        os.rename(backend.tmp / "outbox", backend.tmp / "outbox.away")
        (backend.tmp / "outbox").write_text("not a directory")
    else:
        await backend.raw("ALTER TABLE outbox RENAME TO outbox_away")


async def _repair(backend) -> None:
    if backend.name == "embedded":
        os.unlink(backend.tmp / "outbox")
        os.rename(backend.tmp / "outbox.away", backend.tmp / "outbox")
    else:
        await backend.raw("ALTER TABLE outbox_away RENAME TO outbox")


async def test_a_write_the_store_refuses_is_retried_not_lost(backend):
    clock = FakeClock()
    ob = await _outbox(backend, clock)

    async def send(m):
        return DeliveryResult(ok=False, error="still down", retryable=True)

    stop = asyncio.Event()
    task = asyncio.create_task(ob.run(send, stop))
    await _break(backend)
    eid = ob.put(msg("during the outage"), "send failed")  # does not raise
    await asyncio.sleep(0.2)
    assert ob.unsaved() == 1 and ob.pending() == 1
    await clock.advance(1.0)
    await asyncio.sleep(0.2)
    assert ob.unsaved() == 1  # still refused: kept in memory
    await _repair(backend)
    for _ in range(20):
        await clock.advance(1.0)
        await asyncio.sleep(0.05)
        if ob.unsaved() == 0:
            break
    stop.set()
    await task
    assert ob.unsaved() == 0
    again = await _outbox(backend, clock)
    assert [e.id for e in again.due(clock.time() + 60)] == [eid]
    assert again.get(eid).message.text == "during the outage"


async def test_a_dead_replicas_entries_are_adopted_once(pg_dsn):
    from runtime.storage.postgres.stores import open_records
    from tests.storage_backends import PostgresBackend
    backend = PostgresBackend(pg_dsn)
    bridge = await backend.bridge()
    clock = FakeClock()
    gone = Outbox(None, clock, records=open_records("outbox", bridge, replica="gone"))
    eid = gone.put(msg("orphan"), "x")
    await gone._flush_writes()
    pool = await backend.pool()
    async with pool.acquire() as conn:  # a and b are alive (heartbeat rows), gone is not
        for name in ("a", "b"):
            await membership.beat(conn, name, None)
    a = Outbox(None, clock, records=open_records("outbox", bridge, replica="a"))
    b = Outbox(None, clock, records=open_records("outbox", bridge, replica="b"))
    assert a.pending() == 1 and b.pending() == 0  # a adopted at load; b finds nothing
    assert b.adopt() == 0
    assert [e.id for e in a.due(clock.time() + 5)] == [eid]
    assert await backend.raw("SELECT owner FROM outbox") == [("a",)]
    await backend.close()


async def test_doctor_counts_the_postgres_outbox_without_claiming_it(pg_dsn, tmp_path):
    from gateway.cli.doctor import check_outbox
    from gateway.config.load import parse_config
    from runtime.storage.postgres.stores import open_records
    from tests.helpers import base_config
    from tests.storage_backends import PostgresBackend
    backend = PostgresBackend(pg_dsn)
    bridge = await backend.bridge()
    clock = FakeClock()
    ob = Outbox(None, clock, records=open_records("outbox", bridge, replica="r1"))
    ob.put(msg("waiting"), "down")
    await ob._flush_writes()
    loaded = parse_config(base_config(tmp_path / "state", storage={
        "backend": "postgres", "dsn": pg_dsn}), "test", env={})
    (finding,) = await asyncio.to_thread(check_outbox, {
        "loaded": loaded, "state_dir": tmp_path / "state", "now": clock.time() + 180})
    assert (finding.severity, finding.message) == ("warning",
                                                   "1 replies waiting, oldest 3 min")
    assert await backend.raw("SELECT owner FROM outbox") == [("r1",)]  # not claimed
    await backend.close()


async def test_a_reply_refused_at_stop_is_spilled_and_sent_once_after_restart(
        tmp_path, pg_dsn, pg_server, model, tg):
    """The real gateway on PostgreSQL with Telegram: a reply is queued while both the
    database and Telegram are down, the gateway stops before the database is back (the
    write goes to the spill file, 0600), then a start with both back re-submits it to
    the table and the fake Bot API receives it exactly once; the spill file is gone."""
    from structlog.testing import capture_logs

    from tests.channel_harness import log_events, until
    from tests.helpers import running_gateway
    from tests.test_gateway_telegram import USER, config
    cfg = config(tmp_path, model, tg)
    cfg["storage"] = {"backend": "postgres", "dsn": pg_dsn, "pool": {"connect_timeout": "2s"}}
    spill = tmp_path / "state" / "outbox" / "pending-spill.jsonl"
    reply = OutboundMessage(channel="telegram", to=str(USER), text="kept through both outages",
                            session_key=f"agent:main:telegram:dm:{USER}")
    with capture_logs() as logs:
        try:
            async with running_gateway(cfg) as gw:
                await tg.outage("5xx")
                await asyncio.to_thread(pg_server.stop)
                eid = gw.outbox.put(reply, "telegram: 502 Bad Gateway")  # the deliverer's call
                await until(lambda: log_events(logs, "outbox_write_failed"), timeout=30,
                            what="the refused write")
        finally:
            await asyncio.to_thread(pg_server.start)
        assert log_events(logs, "outbox_spilled", count=1)
        assert not log_events(logs, "outbox_writes_lost_at_exit")
        assert (spill.stat().st_mode & 0o777) == 0o600
        [line] = [json.loads(x) for x in spill.read_text().splitlines()]
        assert (line["op"], line["entry"]["id"]) == ("save", eid)
        await tg.recover()
        async with running_gateway(cfg) as gw:
            assert log_events(logs, "outbox_spill_restored", count=1)
            assert not spill.exists()
            [sent] = await until(lambda: tg.bot_messages(USER), timeout=30,
                                 what="the spilled reply delivered")
            assert sent["text"] == "kept through both outages"
            await until(lambda: gw.outbox.pending() == 0 and gw.outbox.unsaved() == 0,
                        what="the outbox to drain")
        async with running_gateway(cfg):  # a further restart sends nothing again
            await asyncio.sleep(0.5)
    assert [m["text"] for m in tg.bot_messages(USER)] == ["kept through both outages"]
    assert await asyncio.to_thread(pg_query, pg_dsn, "SELECT count(*) FROM outbox") == [(0,)]


async def _pg_with_one_entry(pg_dsn, dir, text: str):
    """(backend, clock, open outbox on ``dir`` as replica r1, id of one stored entry)."""
    from runtime.storage.postgres.stores import open_records
    from tests.storage_backends import PostgresBackend
    backend = PostgresBackend(pg_dsn)
    bridge = await backend.bridge()
    clock = FakeClock()

    def open_outbox(**kw) -> Outbox:
        return Outbox(dir, clock, records=open_records("outbox", bridge, replica="r1"), **kw)
    ob = open_outbox()
    eid = ob.put(msg(text), "down")
    await ob._flush_writes()
    return backend, clock, open_outbox, ob.get(eid)


async def test_a_spill_already_in_the_table_is_not_duplicated(pg_dsn, tmp_path):
    """Re-submitting a spill whose entry the table already holds (a start that stored it
    but died before removing the file) updates that row: one row, one pending entry."""
    backend, clock, open_outbox, entry = await _pg_with_one_entry(pg_dsn, tmp_path, "once")
    eid = entry.id
    write_spill(tmp_path / "pending-spill.jsonl", [("save", entry.to_json())])
    again = open_outbox()
    assert [e.id for e in again.due(clock.time() + 5)] == [eid]
    assert await backend.raw("SELECT id FROM outbox") == [(eid,)]
    assert not (tmp_path / "pending-spill.jsonl").exists()
    await backend.close()


async def test_a_corrupt_spill_file_is_set_aside_and_disables_only_itself(pg_dsn, tmp_path):
    from structlog.testing import capture_logs
    backend, clock, open_outbox, entry = await _pg_with_one_entry(pg_dsn, tmp_path, "stored")
    eid = entry.id
    spill = tmp_path / "pending-spill.jsonl"
    spill.write_bytes(b'{"op": "save", "entry": {"id": "x"\n')  # torn
    problems: list[str] = []
    with capture_logs() as logs:
        ob = open_outbox(problems=problems)
    [bad] = [x for x in logs if x["event"] == "state_file_corrupt"]
    assert bad["owner"] == "outbox" and bad["path"] == str(spill)
    assert not spill.exists()
    assert (tmp_path / "pending-spill.jsonl.corrupt").read_bytes().startswith(b'{"op"')
    assert len(problems) == 1 and "pending-spill.jsonl" in problems[0]
    assert [e.id for e in ob.due(clock.time() + 5)] == [eid]  # the table's entries still go
    ob.put(msg("new"), "down")
    assert ob.flush() == 0
    assert await backend.raw("SELECT count(*) FROM outbox") == [(2,)]
    await backend.close()
