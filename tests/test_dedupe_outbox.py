"""channels/inbound/dedupe.py, channels/outbound/outbox.py and channels/outbound/delivery.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from channels.base import DeliveryResult, InboundMessage, OutboundMessage
from channels.inbound.dedupe import InboundDedupe, dedupe_key
from channels.outbound.delivery import (
    ChunkDeliveryResult,
    DeliveryError,
    MarkupRejected,
    RateLimited,
    is_retryable,
    send_chunks,
    send_with_retry,
)
from channels.outbound.outbox import Outbox, backoff_delay
from channels.outbound.render import RenderedChunk, render_chunks
from runtime.clock import FakeClock

# --- dedupe ---------------------------------------------------------------------------------


def test_dedupe_key_shapes() -> None:
    m = InboundMessage(channel="Telegram", text="x", sender_id="1", message_id="77")
    assert dedupe_key(m) == "telegram:default:1:77"
    g = InboundMessage(channel="slack", text="x", sender_id="U1", chat_type="group",
                       group_id="C9", message_id="1700.1", account_id="work")
    assert dedupe_key(g) == "slack:work:C9:1700.1"
    assert dedupe_key(InboundMessage(channel="slack", text="x", sender_id="U1")) is None


def test_dedupe_exactly_once_across_restart(tmp_path: Path) -> None:
    path = tmp_path / "dedupe.jsonl"
    clock = FakeClock()
    d = InboundDedupe(path, clock)
    assert d.check_and_mark("a") is True
    assert d.check_and_mark("a") is False
    assert d.check_and_mark("b") is True
    d.close()
    lines = path.read_text().splitlines()
    assert [json.loads(x)[1] for x in lines] == ["a", "b"]
    d2 = InboundDedupe(path, clock)  # "restart"
    assert d2.check_and_mark("a") is False
    assert d2.check_and_mark("b") is False
    assert d2.check_and_mark("c") is True


async def test_dedupe_ttl_and_compaction_on_load(tmp_path: Path) -> None:
    path = tmp_path / "dedupe.jsonl"
    clock = FakeClock()
    d = InboundDedupe(path, clock, ttl=100)
    d.check_and_mark("old")
    await clock.advance(60)
    d.check_and_mark("new")
    await clock.advance(50)  # "old" is 110 s old, "new" 50 s
    assert d.check_and_mark("old") is True  # expired -> new again
    d.close()
    await clock.advance(60)  # "new" 110 s, "old" (re-marked) 60 s
    with path.open("a") as f:
        f.write('[1.0, "torn')  # a crash mid-write
    d2 = InboundDedupe(path, clock, ttl=100)
    assert [json.loads(x)[1] for x in path.read_text().splitlines()] == ["old"]
    assert d2.check_and_mark("new") is True
    assert d2.check_and_mark("old") is False


def test_dedupe_max_entries_and_runtime_compaction(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    d = InboundDedupe(path, FakeClock(), max_entries=10)
    for i in range(25):
        assert d.check_and_mark(f"k{i}")
    assert len(d) == 10
    assert d.check_and_mark("k24") is False
    assert d.check_and_mark("k0") is True  # evicted, counts as new
    assert len(path.read_text().splitlines()) <= 21  # compacted at > 2 x max_entries


# --- outbox ---------------------------------------------------------------------------------


def msg(text: str = "hello", channel: str = "telegram") -> OutboundMessage:
    return OutboundMessage(channel=channel, to="123", text=text, session_key="agent:a:main")


def test_backoff_schedule() -> None:
    assert [backoff_delay(n) for n in range(1, 8)] == [5, 30, 120, 600, 1800, 1800, 1800]


def test_outbox_persists_across_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    ob = Outbox(tmp_path / "outbox", clock)
    eid = ob.put(msg("one"), "timeout")
    files = list((tmp_path / "outbox").glob("*.json"))
    assert [f.stem for f in files] == [eid]
    data = json.loads(files[0].read_text())
    assert data["attempts"] == 1 and data["last_error"] == "timeout"
    assert data["created_at"] == "2026-01-01T00:00:00.000Z"
    assert data["next_attempt_at"] == clock.time() + 5
    assert data["message"]["text"] == "one"
    ob2 = Outbox(tmp_path / "outbox", clock)
    assert ob2.pending() == 1
    assert ob2.due(clock.time() + 4.9) == []
    [entry] = ob2.due(clock.time() + 5)
    assert entry.message == msg("one")
    ob2.mark_sent(eid)
    assert ob2.pending() == 0
    assert list((tmp_path / "outbox").glob("*.json")) == []


def test_outbox_corrupt_entry_set_aside(tmp_path: Path) -> None:
    d = tmp_path / "ob"
    d.mkdir()
    (d / "bad.json").write_text("{")
    ob = Outbox(d, FakeClock())
    assert ob.pending() == 0
    assert (d / "bad.json.corrupt").exists()


async def test_outbox_run_backoff_schedule_and_success(tmp_path: Path) -> None:
    clock = FakeClock()
    ob = Outbox(tmp_path, clock)
    t0 = clock.time()
    attempts: list[float] = []
    fail = {"n": 4}

    async def send(m: OutboundMessage) -> DeliveryResult:
        attempts.append(clock.time() - t0)
        if fail["n"] > 0:
            fail["n"] -= 1
            return DeliveryResult(ok=False, error="503", retryable=True)
        return DeliveryResult(ok=True, message_ids=["m1"])

    stop = asyncio.Event()
    ob.put(msg(), "first failure")
    task = asyncio.create_task(ob.run(send, stop))
    await clock.advance(5 + 30 + 120 + 600 + 1800 + 1)
    assert attempts == [5, 35, 155, 755, 2555]
    assert ob.pending() == 0
    stop.set()
    await asyncio.wait_for(task, 1)


async def test_outbox_dead_letter_after_max_attempts(tmp_path: Path) -> None:
    clock = FakeClock()
    ob = Outbox(tmp_path, clock, max_attempts=4)
    calls = 0

    async def send(m: OutboundMessage) -> DeliveryResult:
        nonlocal calls
        calls += 1
        raise ConnectionError("network down")

    stop = asyncio.Event()
    eid = ob.put(msg(), "down")
    task = asyncio.create_task(ob.run(send, stop))
    with capture_logs() as logs:
        await clock.advance(5 + 30 + 120 + 1)
    assert calls == 3  # attempts 2, 3, 4 -> dead
    assert ob.pending() == 0
    dead = json.loads((tmp_path / "dead" / f"{eid}.json").read_text())
    assert dead["attempts"] == 4 and "network down" in dead["last_error"]
    assert not (tmp_path / f"{eid}.json").exists()
    [loud] = [e for e in logs if e["event"] == "outbox_dead_letter"]
    assert loud["log_level"] == "error" and loud["entry_id"] == eid
    stop.set()
    await asyncio.wait_for(task, 1)


async def test_outbox_non_retryable_goes_dead_and_partial_keeps_rest(tmp_path: Path) -> None:
    clock = FakeClock()
    ob = Outbox(tmp_path, clock)
    seen: list[str] = []

    async def send(m: OutboundMessage) -> DeliveryResult:
        seen.append(m.text)
        if m.text == "bad":
            return DeliveryResult(ok=False, error="400 chat not found", retryable=False)
        if m.text == "part1\n\npart2":
            return ChunkDeliveryResult(ok=False, error="timeout", retryable=True,
                                       chunks_sent=1, remaining_text="part2")
        return DeliveryResult(ok=True)

    stop = asyncio.Event()
    bad = ob.put(msg("bad"), "x")
    ob.put(msg("part1\n\npart2"), "x")
    task = asyncio.create_task(ob.run(send, stop))
    await clock.advance(5)
    assert (tmp_path / "dead" / f"{bad}.json").exists()
    assert ob.pending() == 1
    await clock.advance(30)
    assert seen == ["bad", "part1\n\npart2", "part2"]
    assert ob.pending() == 0
    stop.set()
    await asyncio.wait_for(task, 1)


async def test_outbox_wake_on_put_and_reconnect(tmp_path: Path) -> None:
    clock = FakeClock()
    ob = Outbox(tmp_path, clock)
    sent: list[str] = []

    async def send(m: OutboundMessage) -> DeliveryResult:
        sent.append(m.text)
        return DeliveryResult(ok=True)

    stop = asyncio.Event()
    task = asyncio.create_task(ob.run(send, stop))
    await clock.settle()
    ob.put(msg("a"), "x")  # loop was idle (no sleeper); put wakes it, entry due in 5 s
    await clock.advance(4)
    assert sent == []
    await clock.advance(1)
    assert sent == ["a"]
    ob.put(msg("b", channel="slack"), "x")
    await clock.advance(1)
    ob.wake(channel="slack")  # slack reconnected: retry now
    await clock.settle()
    assert sent == ["a", "b"]
    stop.set()
    await asyncio.wait_for(task, 1)
    assert clock.pending_sleepers() == 0


# --- delivery -------------------------------------------------------------------------------


def chunks(*texts: str) -> list[RenderedChunk]:
    return [RenderedChunk(f"<b>{t}</b>", t, f"**{t}**") for t in texts]


async def test_send_chunks_all_ok() -> None:
    sent: list[tuple[str, bool]] = []

    async def send_part(text: str, formatted: bool) -> str:
        sent.append((text, formatted))
        return f"id{len(sent)}"

    r = await send_chunks(chunks("a", "b"), send_part, clock=FakeClock())
    assert r.ok and r.message_ids == ["id1", "id2"] and r.chunks_sent == 2
    assert r.remaining_text is None
    assert sent == [("<b>a</b>", True), ("<b>b</b>", True)]


async def test_send_chunks_markup_fallback_to_plain() -> None:
    sent: list[tuple[str, bool]] = []

    async def send_part(text: str, formatted: bool) -> str:
        sent.append((text, formatted))
        if formatted and text == "<b>b</b>":
            raise MarkupRejected("Bad Request: can't parse entities")
        return str(len(sent))

    r = await send_chunks(chunks("a", "b", "c"), send_part, clock=FakeClock())
    assert r.ok and r.message_ids == ["1", "3", "4"]
    # once the platform refused the markup, the rest of the reply goes out plain (a
    # third formatted send would be refused again)
    assert sent == [("<b>a</b>", True), ("<b>b</b>", True), ("b", False), ("c", False)]


async def test_send_chunks_rate_limit_waits_on_clock() -> None:
    clock = FakeClock()
    sent: list[float] = []
    limited = {"n": 2}

    async def send_part(text: str, formatted: bool) -> str:
        if limited["n"]:
            limited["n"] -= 1
            raise RateLimited(7)
        sent.append(clock.monotonic())
        return "ok"

    task = asyncio.create_task(send_chunks(chunks("a"), send_part, clock=clock))
    await clock.advance(13)
    assert not task.done()
    await clock.advance(1)
    r = await asyncio.wait_for(task, 1)
    assert r.ok and sent == [1000 + 14]


async def test_send_chunks_rate_limit_exhausted_is_retryable_with_rest() -> None:
    clock = FakeClock()

    async def send_part(text: str, formatted: bool) -> str:
        if text == "<b>b</b>":
            raise RateLimited(1000)  # above max_retry_after: do not wait
        return text

    r = await send_chunks(chunks("a", "b", "c"), send_part, clock=clock)
    assert not r.ok and r.retryable and r.chunks_sent == 1
    assert r.message_ids == ["<b>a</b>"]
    assert r.remaining_text == "**b**\n\n**c**"


async def test_send_chunks_other_errors_stop_with_verdict() -> None:
    async def boom_network(text: str, formatted: bool) -> str:
        raise ConnectionRefusedError("refused")  # never connected: certainly not sent

    async def boom_unknown(text: str, formatted: bool) -> str:
        raise ConnectionResetError("reset")  # written, no answer: may have arrived

    async def boom_bad(text: str, formatted: bool) -> str:
        raise DeliveryError("400 bad request", retryable=False)

    r = await send_chunks(chunks("a"), boom_network, clock=FakeClock())
    assert not r.ok and r.retryable and r.chunks_sent == 0 and "refused" in r.error
    r = await send_chunks(chunks("a"), boom_unknown, clock=FakeClock())
    assert (r.ok, r.retryable, r.unconfirmed, r.remaining_text) == (False, False, True, None)
    r = await send_chunks(chunks("a"), boom_bad, clock=FakeClock())
    assert not r.ok and not r.retryable


def test_is_retryable_classification() -> None:
    class HTTPException(Exception):
        def __init__(self, status: int) -> None:
            self.status = status

    class NetworkError(Exception):
        pass

    class BadRequest(NetworkError):  # python-telegram-bot's hierarchy
        pass

    class Resp:
        status_code = 502

    class SlackApiError(Exception):
        response = Resp()

    assert is_retryable(HTTPException(503)) and is_retryable(HTTPException(429))
    assert not is_retryable(HTTPException(403))
    assert is_retryable(NetworkError()) and not is_retryable(BadRequest())
    assert is_retryable(SlackApiError()) and is_retryable(TimeoutError())
    assert not is_retryable(ValueError("bug"))


async def test_send_with_retry() -> None:
    clock = FakeClock()
    calls = 0

    async def once() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RateLimited(2)
        return "m9"

    task = asyncio.create_task(send_with_retry(once, clock=clock))
    await clock.advance(4)
    r = await asyncio.wait_for(task, 1)
    assert r.ok and r.message_ids == ["m9"] and calls == 3

    async def always_limited() -> str:
        raise RateLimited(1)

    task = asyncio.create_task(send_with_retry(always_limited, clock=clock, attempts=2))
    await clock.advance(5)
    r = await asyncio.wait_for(task, 1)
    assert not r.ok and r.retryable

    async def bug() -> str:
        raise ValueError("adapter bug")

    with pytest.raises(ValueError):
        await send_with_retry(bug, clock=clock)


async def test_render_then_send_then_outbox_roundtrip(tmp_path: Path) -> None:
    """The gateway path: render, send fails midway, the rest is queued and sent later."""
    text = "\n\n".join(f"Paragraph {i} with **bold** & more." for i in range(6))
    parts = render_chunks(text, "telegram", limit=80)
    assert len(parts) >= 3
    delivered: list[str] = []

    async def flaky(part: str, formatted: bool) -> str:
        if len(delivered) == 2:
            delivered.append("FAIL")
            raise ConnectionError("down")
        delivered.append(part)
        return str(len(delivered))

    r = await send_chunks(parts, flaky, clock=FakeClock())
    assert not r.ok and r.retryable and r.chunks_sent == 2
    clock = FakeClock()
    ob = Outbox(tmp_path, clock)
    ob.put(msg(r.remaining_text), r.error)
    [entry] = ob.due(clock.time() + 5)
    again = render_chunks(entry.message.text, "telegram", limit=80)
    assert [c.plain for c in again] == [c.plain for c in parts[2:]]
