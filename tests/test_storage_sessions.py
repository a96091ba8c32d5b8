"""The session store on both storage backends (issue 15): the same behaviour through
:class:`gateway.sessions.store.SessionStore` whether its records live in SQLite or PostgreSQL —
writes reach the database, concurrent updates are never lost, removals stick, agents are
isolated, one change writes one row."""

from __future__ import annotations

import asyncio

from gateway.sessions.store import SessionStore
from runtime.clock import FakeClock


async def _store(backend, agent="main", **kw) -> SessionStore:
    records = await backend.session_records(agent)
    return await asyncio.to_thread(SessionStore(backend.sessions_db(agent), agent,
                                                records=records, **kw).load)


async def test_create_is_committed_and_survives_reopen(backend):
    store = await _store(backend, clock=FakeClock(), flush_interval=3600)
    entry = await store.create("agent:main:cli:dm:a", chat_type="dm",
                               route={"channel": "cli", "to": "a"})
    await store.flush()
    row = (await backend.stored_sessions("main"))["agent:main:cli:dm:a"]
    assert row["session_id"] == entry.session_id and row["chat_type"] == "dm"
    assert row["created_at"].endswith("Z")
    await store.close()
    again = await _store(backend)
    assert again.get("agent:main:cli:dm:a").session_id == entry.session_id
    assert again.by_session_id(entry.session_id).last_route == {"channel": "cli", "to": "a"}
    await again.close()


async def test_concurrent_updates_are_never_lost_and_removals_stick(backend):
    store = await _store(backend, clock=FakeClock(), flush_interval=0.001)
    keys = [f"agent:main:cli:dm:{i}" for i in range(50)]
    await asyncio.gather(*(store.create(k) for k in keys))
    for _ in range(20):
        for k in keys:
            store.touch(k, activity=True, counters={"turns": 1})
        await asyncio.sleep(0)
    store.remove(keys[0])
    await store.close()
    stored = await backend.stored_sessions("main")
    assert set(stored) == set(keys[1:])
    reloaded = await _store(backend)
    assert all(e.counters["turns"] == 20 for e in reloaded.entries())
    await reloaded.close()


async def test_one_change_writes_one_row_and_agents_are_isolated(backend):
    main = await _store(backend, clock=FakeClock(), flush_interval=3600)
    ops = await _store(backend, "ops", clock=FakeClock(), flush_interval=3600)
    for i in range(30):
        await main.create(f"agent:main:cli:dm:{i}")
    await ops.create("agent:ops:cli:dm:x")
    await main.flush()
    await ops.flush()
    rows0, tx0 = main.backend.rows_written, main.backend.transactions
    main.touch("agent:main:cli:dm:7", activity=True, counters={"turns": 1})
    await main.flush()
    assert (main.backend.rows_written - rows0, main.backend.transactions - tx0) == (1, 1)
    assert set(await backend.stored_sessions("ops")) == {"agent:ops:cli:dm:x"}
    assert len(await backend.stored_sessions("main")) == 30
    await main.close()
    await ops.close()
