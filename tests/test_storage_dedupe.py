"""Inbound dedupe on both storage backends (issue 15 "Inbound dedupe is one unique
constraint"): a key is new once, stays seen across a restart, is new again after the
TTL; on PostgreSQL two replicas racing for the same key: exactly one wins."""

from __future__ import annotations

import asyncio

from channels.inbound.dedupe import InboundDedupe
from runtime.clock import FakeClock

TTL = 3600.0


async def _dedupe(backend, clock) -> InboundDedupe:
    records = await backend.records("dedupe")
    return await asyncio.to_thread(InboundDedupe, backend.tmp / "seen.jsonl", clock,
                                   ttl=TTL, records=records)


async def test_a_key_is_new_once_and_stays_seen_after_a_restart(backend):
    clock = FakeClock()
    d = await _dedupe(backend, clock)
    assert d.check_and_mark("telegram:main:1:100") is True
    assert d.check_and_mark("telegram:main:1:100") is False
    assert d.seen("telegram:main:1:100")
    d.close()
    await clock.advance(60)
    again = await _dedupe(backend, clock)
    assert again.check_and_mark("telegram:main:1:100") is False  # a redelivery after restart
    assert again.check_and_mark("telegram:main:1:101") is True
    again.close()


async def test_a_key_is_new_again_after_the_ttl(backend):
    clock = FakeClock()
    d = await _dedupe(backend, clock)
    assert d.check_and_mark("slack:w:C1:ev1")
    d.close()
    await clock.advance(TTL + 1)
    again = await _dedupe(backend, clock)
    assert again.check_and_mark("slack:w:C1:ev1") is True
    again.close()


async def test_two_replicas_racing_for_one_key_exactly_one_wins(pg_dsn, tmp_path):
    from tests.storage_backends import PostgresBackend
    backend = PostgresBackend(pg_dsn)
    backend.tmp = tmp_path
    clock = FakeClock()
    replicas = [await _dedupe(backend, clock) for _ in range(3)]
    keys = [f"discord:main:c:{i}" for i in range(40)]
    wins = await asyncio.gather(*(asyncio.to_thread(r.check_and_mark, k)
                                  for k in keys for r in replicas))
    assert sum(wins) == len(keys)  # each key accepted by one replica only
    assert await backend.raw("SELECT count(*) FROM inbound_seen") == [(40,)]
    await backend.close()
