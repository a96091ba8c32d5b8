"""Tool-loop detection (seed 001 §9.5; issue 10): warned at 10, blocked at 20, a
gateway-wide breaker at 30, ping-pong detection — through the gateway and the fake model."""

from __future__ import annotations

from structlog.testing import capture_logs

from runtime.clock import FakeClock
from runtime.tool_loop import BLOCK_NOTICE
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway

T0 = 1_767_225_600.0


def cfg(tmp_path, url, **agent):
    return base_config(tmp_path / "state", url,
                       agents={"defaults": {"model": "fake/fake-model", **agent}})


def tool_messages(request) -> list[dict]:
    return [m for m in request.json["messages"] if m["role"] == "tool"]


async def test_a_loop_is_warned_at_10_and_blocked_at_20(tmp_path):
    async with FakeOpenAI() as fake:
        async with running_gateway(cfg(tmp_path, fake.base_url), clock=FakeClock(T0)) as gw:
            for _ in range(25):
                fake.script_tool_call("read", {"path": "missing.txt"})
            fake.script_text("never reached")
            with capture_logs() as logs:
                r = await gw.local.send("loop please")
    assert r.status == "error" and r.text == BLOCK_NOTICE
    assert len(fake.requests) == 20  # the 20th identical result stops the run
    results = tool_messages(fake.requests[-1])
    assert len(results) == 19
    assert "[tidegate: you have called read 10 times in a row" in results[9]["content"]
    assert all("[tidegate:" not in m["content"] for i, m in enumerate(results) if i != 9)
    warn = [e for e in logs if e["event"] == "tool_loop_warning"]
    block = [e for e in logs if e["event"] == "tool_loop_blocked"]
    assert [w["count"] for w in warn] == [10] and [b["count"] for b in block] == [20]


async def test_changing_results_reset_the_count(tmp_path):
    async with FakeOpenAI() as fake:
        async with running_gateway(cfg(tmp_path, fake.base_url), clock=FakeClock(T0)) as gw:
            ws = gw.config.workspace_for("main")
            for i in range(24):
                fake.script_tool_call("exec", {"command": "echo $RANDOM$RANDOM >> n.txt; "
                                               "wc -l < n.txt"})
            fake.script_text("counted")
            r = await gw.local.send("count")
    assert r.status == "ok" and r.text == "counted" and (ws / "n.txt").exists()


async def test_a_two_tool_ping_pong_is_detected(tmp_path):
    async with FakeOpenAI() as fake:
        async with running_gateway(cfg(tmp_path, fake.base_url), clock=FakeClock(T0)) as gw:
            for i in range(10):
                fake.script_tool_call("read", {"path": "a.txt" if i % 2 == 0 else "b.txt"})
            fake.script_text("stopping")
            with capture_logs() as logs:
                r = await gw.local.send("ping pong")
    assert r.text == "stopping"
    results = tool_messages(fake.requests[-1])
    assert "alternating with another tool" in results[9]["content"]
    warn = [e for e in logs if e["event"] == "tool_loop_warning"]
    assert warn and warn[0]["pattern"] == "ping-pong"


async def test_the_global_breaker_pauses_a_tool_for_every_run_until_it_resets(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        async with running_gateway(cfg(tmp_path, fake.base_url), clock=clock) as gw:
            for who in ("alice", "bob"):  # 16 identical calls = 15 repeats each
                for _ in range(16):
                    fake.script_tool_call("read", {"path": "missing.txt"})
                fake.script_text(f"done {who}")
                assert (await gw.local.send("loop", to=who)).status == "ok"
            status = gw.status()
            assert "read" in status["tool_loop"]["paused_tools"]
            assert any("tool loop breaker: read" in p for p in status["problems"])
            fake.script_tool_call("read", {"path": "notes.txt"})
            fake.script_text("ok")
            await gw.local.send("read my notes", to="carol")
            assert "paused gateway-wide" in tool_messages(fake.requests[-1])[-1]["content"]

            await clock.advance(601)
            assert gw.status()["tool_loop"]["paused_tools"] == {}
            fake.script_tool_call("read", {"path": "notes.txt"})
            fake.script_text("ok")
            await gw.local.send("read my notes again", to="carol")
            assert "paused" not in tool_messages(fake.requests[-1])[-1]["content"]
