"""Local channels (issue 2 §9): the OpenAI-compatible API driven by the real openai SDK,
the webchat page and WebSocket, and the control API's auth."""

import aiohttp
import openai
import pytest

from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway


@pytest.fixture
async def gateway(tmp_path):
    async with FakeOpenAI() as fake:
        async with running_gateway(base_config(tmp_path / "state", fake.base_url)) as gw:
            gw.fake = fake
            yield gw


async def test_openai_compatible_chat_completions(gateway):
    gw = gateway
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key=gw.token,
                                max_retries=0)
    models = await client.models.list()
    assert [m.id for m in models.data] == ["tidegate/main"]
    gw.fake.script_text("Hi Ann, nice to meet you.")
    resp = await client.chat.completions.create(
        model="tidegate/main", user="ann",
        messages=[{"role": "system", "content": "ignored"},
                  {"role": "user", "content": "I am Ann"}])
    assert resp.choices[0].message.content == "Hi Ann, nice to meet you."
    assert gw.agents["main"].store.get("agent:main:openai:dm:ann") is not None

    gw.fake.script_text("You told me you are Ann.")
    stream = await client.chat.completions.create(
        model="tidegate/main", user="ann", stream=True,
        messages=[{"role": "user", "content": "who am I?"}])
    parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(parts) == "You told me you are Ann."
    assert len(parts) > 2  # really streamed, not one chunk
    # Same session: the model saw the first exchange.
    sent = gw.fake.requests[-1].json["messages"]
    assert any(m.get("content") == "I am Ann" for m in sent)

    gw.fake.script_text("keyed")
    await client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Session-Key": "agent:main:openai:dm:custom"})
    assert gw.agents["main"].store.get("agent:main:openai:dm:custom") is not None

    bad = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key="wrong",
                             max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await bad.chat.completions.create(model="tidegate/main",
                                          messages=[{"role": "user", "content": "x"}])
    await client.close()
    await bad.close()


async def test_openai_api_reports_the_turns_token_usage(gateway):
    gw = gateway
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key=gw.token,
                                max_retries=0)
    gw.fake.script_text("Hello.", usage={"prompt_tokens": 120, "completion_tokens": 9})
    resp = await client.chat.completions.create(
        model="tidegate/main", user="ann", messages=[{"role": "user", "content": "hi"}])
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens,
            resp.usage.total_tokens) == (120, 9, 129)

    # a turn with a tool round: usage counts both model calls
    gw.fake.push({"type": "tool_calls", "text": "", "calls": [
        {"id": "c1", "name": "write", "arguments": {"path": "a.txt", "content": "x"}}],
        "usage": {"prompt_tokens": 200, "completion_tokens": 20}})
    gw.fake.script_text("Written.", usage={"prompt_tokens": 260, "completion_tokens": 5})
    resp = await client.chat.completions.create(
        model="gpt-4o", user="ann", messages=[{"role": "user", "content": "write a.txt"}])
    assert resp.model == "tidegate/main"  # an unknown model name goes to the default agent
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens,
            resp.usage.total_tokens) == (460, 25, 485)

    # streaming: usage only when asked for, in a last chunk without choices
    gw.fake.script_text("Streamed answer here.", usage={"prompt_tokens": 50,
                                                        "completion_tokens": 4})
    stream = await client.chat.completions.create(
        model="tidegate/main", user="ann", stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "again"}])
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == \
        "Streamed answer here."
    assert all(c.choices and c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens,
            last.usage.total_tokens) == (50, 4, 54)

    gw.fake.script_text("No usage asked.")
    stream = await client.chat.completions.create(
        model="tidegate/main", user="ann", stream=True,
        messages=[{"role": "user", "content": "once more"}])
    chunks = [c async for c in stream]
    assert all(c.choices and c.usage is None for c in chunks)
    await client.close()


async def test_openai_api_joins_content_parts_with_newlines(gateway):
    gw = gateway
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key=gw.token,
                                max_retries=0)
    gw.fake.script_text("ok")
    await client.chat.completions.create(model="tidegate/main", user="bo", messages=[
        {"role": "user", "content": [{"type": "text", "text": "part one"},
                                     {"type": "image_url",
                                      "image_url": {"url": "data:image/png;base64,AA=="}},
                                     {"type": "text", "text": "part two"}]}])
    sent = gw.fake.requests[-1].json["messages"]
    assert any(m.get("content") == "part one\npart two" for m in sent), sent
    await client.close()


async def test_control_api_auth_and_probes(gateway):
    base = f"http://127.0.0.1:{gateway.port}"
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/healthz") as r:
            body = await r.json()
            assert r.status == 200 and (body["ok"], body["status"]) == (True, "live")
            assert len(body["instance"]) == 16  # a hash of the state dir, not the path
        async with s.get(f"{base}/readyz") as r:
            assert r.status == 200
        for method, path in (("GET", "/status"), ("POST", "/api/agent"),
                             ("GET", "/api/sessions"), ("POST", "/api/system-event")):
            async with s.request(method, base + path) as r:
                assert r.status == 401, path
        async with s.get(f"{base}/status?token={gateway.token}") as r:
            assert r.status == 401  # the query-string token is for the webchat socket only
        headers = {"Authorization": f"Bearer {gateway.token}"}
        async with s.post(f"{base}/api/agent", json={"message": "hi",
                                                     "session_key": "bogus"},
                          headers=headers) as r:
            assert r.status == 400 and "not a session key" in (await r.json())["error"]
    gateway.stopping = True
    async with aiohttp.ClientSession() as s, s.get(f"{base}/readyz") as r:
        assert r.status == 503
    gateway.stopping = False


async def test_webchat_page_and_websocket(gateway):
    gw = gateway
    base = f"http://127.0.0.1:{gw.port}"
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/") as r:
            assert r.status == 200 and "<title>tidegate control</title>" in await r.text()
        with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
            await s.ws_connect(f"{base}/ws?client=abc")  # no token
        assert exc.value.status == 401
    async with aiohttp.ClientSession() as s:
        gw.fake.script_text("hello from the agent")
        async with s.ws_connect(f"{base}/ws?token={gw.token}&client=web-1") as ws:
            assert (await ws.receive_json())["type"] == "ready"
            await ws.send_json({"type": "message", "text": "hi from the browser"})
            deltas, reply = [], None
            while reply is None:
                m = await ws.receive_json(timeout=10)
                if m["type"] == "delta":
                    deltas.append(m["text"])
                elif m["type"] == "reply":
                    reply = m
            assert reply["text"] == "hello from the agent"
            assert "".join(deltas) == "hello from the agent"
            assert reply["session_key"] == "agent:main:webchat:dm:web-1"


async def test_cron_add_refuses_a_delivery_target_that_cannot_work(gateway):
    base = f"http://127.0.0.1:{gateway.port}"
    headers = {"Authorization": f"Bearer {gateway.token}"}
    async with aiohttp.ClientSession(headers=headers) as s:
        for target, why in (("nosuch:123", "unknown channel 'nosuch'"),
                            ("telegram:42", "channel 'telegram' is not enabled")):
            async with s.post(f"{base}/api/cron", json={
                    "name": "x", "schedule": {"kind": "every", "interval": 3600},
                    "message": "m", "delivery": target}) as r:
                assert r.status == 400 and why in (await r.json())["error"]


async def test_a_wake_for_a_session_that_does_not_exist_starts_nothing(gateway):
    import asyncio
    base = f"http://127.0.0.1:{gateway.port}"
    headers = {"Authorization": f"Bearer {gateway.token}"}
    async with aiohttp.ClientSession(headers=headers) as s:
        async with s.post(f"{base}/api/system-event", json={
                "text": "x", "session_key": "agent:main:nonexistent", "wake": "now"}) as r:
            # refused: nothing would ever read it (issue 14 point 6)
            assert r.status == 404 and "no session agent:main:nonexistent" in \
                (await r.json())["error"]
    await asyncio.sleep(0.5)  # past the wake coalescing window
    assert gateway.fake.requests == []  # no conversation with nobody
    assert gateway.agents["main"].store.get("agent:main:nonexistent") is None
