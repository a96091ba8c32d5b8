"""DM pairing on both storage backends (issue 15): a code requested by the gateway and
approved by another process (the CLI, another replica) counts in the gateway; revokes
stick; a corrupt document disables pairing on that channel only and is not overwritten."""

from __future__ import annotations

import asyncio
import time

import pytest

from channels.access.pairing import PairingStore, PairingUnavailable
from runtime.clock import FakeClock


async def _store(backend, clock, problems=None) -> PairingStore:
    records = await backend.records("pairing")
    return PairingStore(backend.tmp, clock, problems=problems, records=records)


async def _until(pred, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(pred):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_an_approval_by_another_process_counts_here(backend):
    clock = FakeClock()
    gateway, cli = await _store(backend, clock), await _store(backend, clock)
    req = await asyncio.to_thread(gateway.request, "telegram", "main", "42", "Ann")
    assert req.is_new and not gateway.is_approved("telegram", "main", "42")
    assert [r.code for r in await asyncio.to_thread(cli.list_pending)] == [req.code]
    assert (await asyncio.to_thread(cli.approve, "telegram", req.code.lower())) is not None
    await _until(lambda: gateway.is_approved("telegram", "main", "42"), "approval seen")
    assert not gateway.is_approved("telegram", "main", "43")
    assert not gateway.is_approved("slack", "main", "42")  # another channel
    assert await asyncio.to_thread(cli.revoke, "telegram", "42")
    await _until(lambda: not gateway.is_approved("telegram", "main", "42"), "revoke seen")


async def test_concurrent_requests_keep_at_most_three_pending(backend):
    clock = FakeClock()
    stores = [await _store(backend, clock) for _ in range(3)]
    await asyncio.gather(*(asyncio.to_thread(s.request, "discord", "main", f"u{i}")
                           for i, s in enumerate(stores * 2)))
    pending = await asyncio.to_thread((await _store(backend, clock)).list_pending, "discord")
    assert len(pending) == 3  # every write saw the others' (none lost, cap kept)


async def test_a_corrupt_document_disables_only_its_channel(backend):
    clock = FakeClock()
    first = await _store(backend, clock)
    req = await asyncio.to_thread(first.request, "telegram", "main", "42")
    await asyncio.to_thread(first.approve, "telegram", req.code)
    await asyncio.to_thread(first.request, "slack", "main", "U1")
    if backend.name == "embedded":
        (backend.tmp / "pairing" / "telegram.json").write_text("{broken")
    else:
        await backend.raw("UPDATE pairing SET body = '{broken', rev = rev + 1 "
                          "WHERE channel = 'telegram'")
    problems: list[str] = []
    store = await _store(backend, clock, problems)
    assert await asyncio.to_thread(store.check) and len(problems) == 1
    assert not store.is_approved("telegram", "main", "42")
    with pytest.raises(PairingUnavailable):
        await asyncio.to_thread(store.request, "telegram", "main", "99")
    assert [r.sender_id for r in await asyncio.to_thread(store.list_pending, "slack")] \
        == ["U1"]
    if backend.name == "embedded":
        assert (backend.tmp / "pairing" / "telegram.json").read_text() == "{broken"
    else:
        assert await backend.raw("SELECT convert_from(body, 'UTF8') FROM pairing WHERE "
                                 "channel = 'telegram'") == [("{broken",)]
