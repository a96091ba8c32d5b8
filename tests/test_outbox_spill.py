"""The outbox spill while the gateway runs (issue 15 "nothing accepted is lost";
channels/outbound/spill.py): outbox writes PostgreSQL refuses are mirrored in
``<state_dir>/outbox/pending-spill.jsonl`` as soon as they are refused (a crash keeps
them, not only a clean stop), ``status`` (control API and ``tidegate status``) and
``tidegate doctor`` report the waiting spill (count, oldest age) as a problem, and the
running gateway re-submits it the moment PostgreSQL is back, without a restart. A real
PostgreSQL stopped and started, the real gateway with the real python-telegram-bot
client against the fake Bot API."""

from __future__ import annotations

import asyncio
import json
import re
import time

from channels.base import OutboundMessage
from channels.outbound.outbox import Outbox
from gateway.cli.doctor import check_outbox
from gateway.config.load import parse_config
from runtime.clock import FakeClock
from runtime.storage.postgres.stores import open_records
from tests.channel_harness import log_events, run_cli, until, write_config
from tests.storage_backends import PostgresBackend, pg_query


def _reply(user: int, text: str) -> OutboundMessage:
    return OutboundMessage(channel="telegram", to=str(user), text=text,
                           session_key=f"agent:main:telegram:dm:{user}")


async def test_a_running_gateway_reports_its_spill_and_resubmits_it_when_postgres_is_back(
        tmp_path, pg_dsn, pg_server, model, tg):
    from structlog.testing import capture_logs

    from gateway.service.status import gateway_status
    from tests.helpers import running_gateway
    from tests.test_gateway_telegram import USER, config
    cfg = config(tmp_path, model, tg)
    cfg["storage"] = {"backend": "postgres", "dsn": pg_dsn, "pool": {"connect_timeout": "2s"}}
    path = write_config(tmp_path, cfg)
    spill = tmp_path / "state" / "outbox" / "pending-spill.jsonl"
    with capture_logs() as logs:
        async with running_gateway(cfg) as gw:
            await tg.outage("5xx")
            await asyncio.to_thread(pg_server.stop)
            try:
                eid = gw.outbox.put(_reply(USER, "kept through the outage"),
                                    "telegram: 502 Bad Gateway")  # the deliverer's call
                # on disk while the gateway runs, not only at its stop
                await until(spill.exists, timeout=30, what="the spill file")
                [line] = [json.loads(x) for x in spill.read_text().splitlines()]
                assert (line["op"], line["entry"]["id"]) == ("save", eid)
                assert (spill.stat().st_mode & 0o777) == 0o600
                st = gateway_status(gw)
                assert st["outbox"]["spill"]["count"] == 1
                assert st["outbox"]["spill"]["oldest_age_s"] >= 0
                assert any(p.startswith("outbox: 1 writes PostgreSQL refused wait in ")
                           for p in st["problems"])
                code, out, _ = await run_cli(path, "status", "--json")
                assert code == 0 and json.loads(out)["outbox"]["spill"]["count"] == 1
                loaded = parse_config(cfg, "test", env={})
                findings = await asyncio.to_thread(check_outbox, {
                    "loaded": loaded, "state_dir": tmp_path / "state",
                    "now": time.time() + 120})
                spilled = [f for f in findings if "pending-spill.jsonl" in f.message]
                assert [f.severity for f in spilled] == ["error"]
                assert spilled[0].message.startswith("1 outbox writes wait in ")
                age = int(re.search(r", oldest (\d+) s", spilled[0].message).group(1))
                assert 120 <= age < 300  # the doctor's clock is 120 s ahead
            finally:
                await asyncio.to_thread(pg_server.start)
            # PostgreSQL is back: the running gateway re-submits, no restart
            await until(lambda: not spill.exists(), timeout=30, what="the spill re-submitted")
            assert await asyncio.to_thread(pg_query, pg_dsn,
                                           "SELECT id FROM outbox") == [(eid,)]
            st = gateway_status(gw)
            assert st["outbox"]["spill"] is None
            assert not [p for p in st["problems"] if p.startswith("outbox:")]
            findings = await asyncio.to_thread(check_outbox, {
                "loaded": parse_config(cfg, "test", env={}),
                "state_dir": tmp_path / "state", "now": time.time()})
            assert not [f for f in findings if "pending-spill" in f.message]
            await tg.recover()
            gw.outbox.wake("telegram")
            [sent] = await until(lambda: tg.bot_messages(USER), timeout=30,
                                 what="the reply delivered")
            assert sent["text"] == "kept through the outage"
            await until(lambda: gw.outbox.pending() == 0 and gw.outbox.unsaved() == 0,
                        what="the outbox to drain")
        assert log_events(logs, "outbox_spill_restored", count=1)
        assert not log_events(logs, "outbox_writes_lost_at_exit")
        async with running_gateway(cfg):  # a further start sends nothing again
            await asyncio.sleep(0.5)
    assert [m["text"] for m in tg.bot_messages(USER)] == ["kept through the outage"]
    assert await asyncio.to_thread(pg_query, pg_dsn, "SELECT count(*) FROM outbox") == [(0,)]


async def test_a_refused_write_survives_a_crash_in_the_spill_file(tmp_path, pg_dsn, pg_server):
    """No flush, no stop (kill -9): the refused write is already in the spill file, and
    the next start stores it once."""
    backend = PostgresBackend(pg_dsn)
    bridge = await backend.bridge()
    clock = FakeClock()
    dead = Outbox(tmp_path, clock, records=open_records("outbox", bridge, replica="r1"))
    await asyncio.to_thread(pg_server.stop)
    try:
        eid = dead.put(_reply(42, "not lost"), "down")
        await dead._flush_writes()  # refused by the stopped server
        assert dead.unsaved() == 1 and (tmp_path / "pending-spill.jsonl").exists()
        assert dead.spill_status()["count"] == 1
    finally:
        await asyncio.to_thread(pg_server.start)
    del dead  # the process died here: never flushed, never stopped
    bridge2 = await backend.bridge()
    fresh = await asyncio.to_thread(Outbox, tmp_path, clock,
                                    records=open_records("outbox", bridge2, replica="r1"))
    assert not (tmp_path / "pending-spill.jsonl").exists()
    assert fresh.get(eid).message.text == "not lost" and fresh.spill_status() is None
    assert await backend.raw("SELECT id FROM outbox") == [(eid,)]
    await backend.close()
