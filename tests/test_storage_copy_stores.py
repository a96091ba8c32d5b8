"""``storage copy`` of the smaller stores (issue 15 "Migration"): cron jobs and run logs,
the outbox (pending and dead letters) and the inbound dedupe keys of a real embedded
state dir (written by the real services) are copied into PostgreSQL in the copy's
transaction and verified row by row; the PostgreSQL services then carry on with them. A
copy that went wrong is reported."""

from __future__ import annotations

import asyncio
import time

from channels.access.pairing import PairingStore
from channels.base import OutboundMessage
from channels.discord.catchup import ChannelCursors
from channels.inbound.dedupe import InboundDedupe
from channels.matrix.sync_state import SyncState
from channels.outbound.outbox import Outbox
from runtime.approvals.store import ApprovalStore
from runtime.clock import FakeClock
from runtime.storage import copy
from runtime.storage.config import StorageSection
from runtime.storage.embedded.document_file import DocumentFile
from runtime.storage.postgres.bridge import SyncBridge
from runtime.storage.postgres.documents import PgDocument
from runtime.storage.postgres.pool import open_database
from runtime.storage.postgres.stores import open_records
from runtime.usage.ledger import UsageLedger
from scheduler.cron.job import new_job
from scheduler.cron.service import CronService, RunOutcome
from scheduler.cron.store import CronStore
from scheduler.heartbeat.rules import DeliveryDeduper


async def _embedded_state(state, clock):
    async def execute(job):
        return RunOutcome("ok")

    svc = CronService(CronStore(state / "cron" / "jobs.json"), clock, execute)
    await svc.start()
    job = await svc.add(new_job(name="daily", schedule={"kind": "every", "interval": 60},
                                message="hi", now=clock.time()))
    await svc.run_now(job.id)
    await svc.run_now(job.id)
    await svc.stop()
    ob = Outbox(state / "outbox", clock, max_attempts=2)
    pending = ob.put(OutboundMessage(channel="telegram", to="1", text="queued"), "down")
    dead = ob.put(OutboundMessage(channel="telegram", to="1", text="dead"), "down")
    ob.mark_failed(dead, "still down")  # attempt 2 of 2: a dead letter
    d = InboundDedupe(state / "channels" / "inbound-seen.jsonl", clock)
    for i in range(5):
        d.check_and_mark(f"telegram:main:1:{i}")
    d.close()
    ledger = DeliveryDeduper(clock, path=state / "heartbeat" / "delivered.json")
    ledger.record("main", "ALERT: disk full")
    usage = UsageLedger(state / "usage")
    usage.append({"agent": "main", "input": 3}, clock.time())
    usage.close()
    PairingStore(state, clock).request("telegram", "main", "42", "Ann")
    ChannelCursors(state / "channels" / "discord-default-cursors.json").advance("7", "99")
    matrix = SyncState(DocumentFile(state / "channels" / "matrix-default-sync.json"))
    matrix.add_direct("!dm:hs", "@ann:hs")
    matrix.save("s42_7")
    ApprovalStore(state).add_pattern("main", "/usr/bin/git push", "telegram:1001", 1.5e9)
    return job, pending, dead


async def test_copy_moves_cron_outbox_and_dedupe_and_the_services_carry_on(tmp_path, pg_dsn):
    clock = FakeClock(time.time())  # the copy keeps the dedupe keys of the last 7 days
    state = tmp_path / "state"
    job, pending, _dead = await _embedded_state(state, clock)
    src = await asyncio.to_thread(copy.read_source, state, state / "timeline.db", [])
    pool = await open_database(StorageSection(backend="postgres", dsn=pg_dsn))
    await copy.write_target(pool, src)
    report = await copy.verify_target(pool, src, state)
    assert report.ok, report.problems
    assert report.stores == {"pairing": 1, "state documents": 3, "usage ledger": 1, "cron jobs": 1,
                             "cron runs": 2, "outbox": 2, "inbound dedupe": 5,
                             "exec approval patterns": 1}
    bridge = await asyncio.to_thread(SyncBridge, pg_dsn)
    store = CronStore(records=open_records("cron", bridge))
    assert [j.id for j in store.load()] == [job.id]
    assert [r["manual"] for r in store.read_runs(job.id, 10)] == [True, True]
    ob = Outbox(None, clock, records=open_records("outbox", bridge, replica="r1"))
    assert [e.id for e in ob.due(clock.time() + 60)] == [pending]  # adopted; not the dead
    d = InboundDedupe(None, clock, records=open_records("dedupe", bridge))
    assert d.check_and_mark("telegram:main:1:3") is False  # seen on the single host
    assert d.check_and_mark("telegram:main:1:9") is True
    hb = DeliveryDeduper(clock, records=open_records("heartbeat_ledger", bridge))
    assert hb.seen("main", "ALERT: disk full")
    assert [r["input"] for r in open_records("usage", bridge).records()] == [3]
    pairing = PairingStore(state, clock, records=open_records("pairing", bridge))
    assert [r.sender_id for r in pairing.list_pending("telegram")] == ["42"]
    assert ChannelCursors(None, open_records("discord_cursors", bridge, account="default")
                          ).items() == [("7", "99")]
    # the Matrix sync position, where the plugin's ChannelContext.document finds it
    matrix = SyncState(PgDocument(bridge, "matrix/default/sync.json"))
    await asyncio.to_thread(matrix.load)
    assert (matrix.next_batch, matrix.room_of("@ann:hs")) == ("s42_7", "!dm:hs")
    # the "always allow" pattern, as the replicas' approvals read it
    from gateway.cluster.approvals import PgApprovals
    from gateway.cluster.db import ClusterDB
    db = ClusterDB(pg_dsn)
    try:
        assert await PgApprovals(db, "r1", 15.0).patterns("main") == ["/usr/bin/git push"]
    finally:
        await db.close()
    # a row lost after the copy: verification says so
    await pool.execute("DELETE FROM cron_runs WHERE id = (SELECT max(id) FROM cron_runs)")
    bad = await copy.verify_target(pool, src, state)
    assert not bad.ok and any("cron runs: 1 rows copied, source has 2" in p
                              for p in bad.problems)
    await asyncio.to_thread(bridge.close)
    await pool.close()
