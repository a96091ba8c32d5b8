"""Silent replies (``NO_REPLY``, README "Silent replies") on the local surfaces: the
OpenAI-compatible endpoint (JSON and SSE), the webchat WebSocket and ``tidegate agent -m`` /
``chat``. The model is the fake OpenAI server; what the client received is asserted as
bytes, and the transcript on disk keeps the raw reply."""

import asyncio
import io
import json
import sys

import aiohttp
import pytest
import yaml

from gateway.cli.chat import _chat_turn
from gateway.cli.client import ControlClient
from tests.fakes.fake_openai import FakeOpenAI, StreamGate
from tests.helpers import ROOT, base_config, running_gateway

# (what the model streams, piece by piece; what the user is shown)
CASES = [
    (["NO_", "REP", "LY"], ""),
    (["**NO", "_REPLY**"], ""),
    (["see ", "NO_RE", "PLY ", "here"], "see here"),
]


@pytest.fixture
async def gateway(tmp_path):
    async with FakeOpenAI() as fake:
        config = base_config(tmp_path / "state", fake.base_url)
        async with running_gateway(config) as gw:
            gw.fake, gw.config_path = fake, tmp_path / "config.yaml"
            gw.config_path.write_text(yaml.safe_dump(config))
            yield gw


def script(gw, pieces, gate=None):
    gw.fake.push({"type": "text", "text": "".join(pieces), "pieces": pieces, "gate": gate})


def assistant_texts(gw) -> list[str]:
    """Every assistant message of every transcript JSONL under the state dir."""
    said = [e["message"]["content"] for path in (gw.state_dir / "agents").rglob("*.jsonl")
            for e in map(json.loads, path.read_text().splitlines())
            if e.get("type") == "message" and e["message"]["role"] == "assistant"]
    return [c if isinstance(c, str) else "".join(p.get("text", "") for p in c) for c in said]


async def assert_raw_kept(gw, pieces):
    """The transcript on disk and the timeline hold the reply as the model wrote it."""
    raw = "".join(pieces)
    assert raw in assistant_texts(gw)
    await gw.timeline_hooks.flush()
    events = [e for a in gw.agents.values() for entry in a.store.entries()
              for e in await gw.timeline_hooks.timeline.get_timeline(entry.session_id)]
    said = [e.content for e in events if e.event_type == "LLM_RESPONSE"]
    assert any(raw in str(c) for c in said), (raw, [e.event_type for e in events])


async def post(gw, body, session):
    return await session.post(f"http://127.0.0.1:{gw.port}/v1/chat/completions", json=body,
                              headers={"Authorization": f"Bearer {gw.token}"})


def sse_events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.splitlines()
            if line.startswith("data: ")]


def contents(events: list[str]) -> list[str]:
    return [c["delta"].get("content") or "" for e in events if e != "[DONE]"
            for c in json.loads(e)["choices"]]


@pytest.mark.parametrize("pieces,shown", CASES)
async def test_openai_endpoint_sends_nothing_of_a_silent_reply(gateway, pieces, shown):
    gw = gateway
    async with aiohttp.ClientSession() as s:
        script(gw, pieces)
        r = await post(gw, {"model": "tidegate/main", "user": "ann",
                            "messages": [{"role": "user", "content": "hi"}]}, s)
        choice = (await r.json())["choices"][0]
        assert choice["message"]["content"] == shown
        assert choice["finish_reason"] == "stop"
        script(gw, pieces)
        r = await post(gw, {"model": "tidegate/main", "user": "ann", "stream": True,
                            "messages": [{"role": "user", "content": "again"}]}, s)
        events = sse_events(await r.text())
    assert "NO_RE" not in "".join(events)
    assert "".join(contents(events)) == shown
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop"
    if not shown:  # no content chunk at all, only the role chunk's ""
        assert [c for c in contents(events) if c] == []
    await assert_raw_kept(gw, pieces)


async def test_openai_stream_of_a_normal_reply_is_not_held_back(gateway):
    gw, gate = gateway, StreamGate()
    script(gw, ["Tides ", "turn ", "twice ", "NOT ", "daily."], gate)
    async with aiohttp.ClientSession() as s:
        r = await post(gw, {"model": "x", "stream": True,
                            "messages": [{"role": "user", "content": "tides?"}]}, s)
        gate.allow(2)  # the model is still writing after two words...
        got = []
        while "".join(got).strip() != "Tides turn":
            line = (await asyncio.wait_for(r.content.readline(), 10)).decode().strip()
            if line.startswith("data: {"):
                got += contents([line.removeprefix("data: ")])
        assert gate.sent == 2  # ...and the client already has them
        gate.open()
        rest = sse_events((await r.read()).decode())
    assert "".join(got + contents(rest)) == "Tides turn twice NOT daily."
    assert rest[-1] == "[DONE]"


async def webchat_turn(ws, text: str) -> tuple[list[dict], dict]:
    await ws.send_json({"type": "message", "text": text})
    frames = []
    while True:
        m = await ws.receive_json(timeout=10)
        frames.append(m)
        if m["type"] == "reply":
            return frames, m


@pytest.mark.parametrize("pieces,shown", CASES)
async def test_webchat_shows_nothing_of_a_silent_reply(gateway, pieces, shown):
    gw = gateway
    async with aiohttp.ClientSession() as s, s.ws_connect(
            f"http://127.0.0.1:{gw.port}/ws?token={gw.token}&client=web-1") as ws:
        assert (await ws.receive_json())["type"] == "ready"
        await ws.receive_json()  # history
        script(gw, pieces)
        frames, reply = await webchat_turn(ws, "hi")
    assert "NO_RE" not in json.dumps(frames)
    assert "".join(f["text"] for f in frames if f["type"] == "delta") == shown
    assert (reply["text"], reply["silent"]) == (shown, not shown)
    await assert_raw_kept(gw, pieces)


async def cli(gw, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "--config", str(gw.config_path), *args,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode()


@pytest.mark.parametrize("pieces,shown", CASES)
async def test_agent_m_prints_nothing_and_chat_shows_nothing(gateway, pieces, shown):
    gw = gateway
    script(gw, pieces)
    assert await cli(gw, "agent", "-m", "hi", "-q") == (0, shown + "\n" if shown else "")
    script(gw, pieces)
    code, out = await cli(gw, "agent", "-m", "hi", "--json")
    assert code == 0 and json.loads(out)["reply"] == shown
    assert json.loads(out)["silent"] is not bool(shown)
    script(gw, pieces)
    chat_out = io.StringIO()
    client = ControlClient(f"http://127.0.0.1:{gw.port}", gw.token)
    await asyncio.to_thread(_chat_turn, client, {"message": "again"}, chat_out)
    assert chat_out.getvalue() == (f"agent> {shown}\n" if shown else "")
    await assert_raw_kept(gw, pieces)


async def test_openai_stream_keeps_rounds_apart_and_a_silent_round_out(gateway):
    gw = gateway
    gw.fake.script_tool_call("write", {"path": "a.md", "content": "x"},
                             text="Let me write that down.")
    gw.fake.script_tool_call("write", {"path": "b.md", "content": "y"}, text="NO_REPLY")
    gw.fake.script_text("Done.")
    async with aiohttp.ClientSession() as s:
        r = await post(gw, {"model": "x", "stream": True,
                            "messages": [{"role": "user", "content": "note it"}]}, s)
        events = sse_events(await r.text())
    assert "".join(contents(events)) == "Let me write that down.\n\nDone."
    assert events[-1] == "[DONE]"
