"""Model providers (OpenAI over its thin HTTP client, Anthropic through its SDK) against
local fakes speaking the real protocols.

Assertions are on what the fake server received (the wire format), on what reached
``on_delta``, and on the ProviderError the runtime would see.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs

from runtime.clock import FakeClock
from runtime.providers import (
    AnthropicProvider,
    ChatMessage,
    EchoProvider,
    ModelRequest,
    OpenAIProvider,
    ProviderError,
    ProviderRegistry,
    ToolCall,
    ToolSpec,
    parse_model_ref,
)

try:
    from tests.fakes.fake_anthropic import FakeAnthropic
    from tests.fakes.fake_openai import FakeOpenAI
except ModuleNotFoundError:  # pytest put tests/ (not the repo root) on sys.path
    from fakes.fake_anthropic import FakeAnthropic  # type: ignore[no-redef]
    from fakes.fake_openai import FakeOpenAI  # type: ignore[no-redef]

KEY = "sk-test-SECRET-0123456789"
REPO = Path(__file__).resolve().parent.parent
WRITE = ToolSpec(
    name="write",
    description="Write a file",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)


def request(text: str = "hello", **kwargs) -> ModelRequest:
    kwargs.setdefault("system", "You are tidegate.")
    return ModelRequest(model="test-model", messages=[ChatMessage("user", text)], **kwargs)


def tool_history() -> list[ChatMessage]:
    """user → assistant calling two tools → both results (one an error)."""
    return [
        ChatMessage("user", "write two files"),
        ChatMessage(
            "assistant",
            "Writing.",
            tool_calls=[
                ToolCall("call_1", "write", {"path": "a.txt", "content": "é"}),
                ToolCall("call_2", "write", {"path": "b.txt"}),
            ],
        ),
        ChatMessage("tool", "wrote a.txt", tool_call_id="call_1", name="write"),
        ChatMessage("tool", "disk full", tool_call_id="call_2", name="write", is_error=True),
    ]


@pytest.fixture
async def oai():
    async with FakeOpenAI() as fake:
        provider = OpenAIProvider("openai", fake.base_url, KEY)
        yield fake, provider
        await provider.close()


@pytest.fixture
async def ant():
    async with FakeAnthropic() as fake:
        provider = AnthropicProvider("anthropic", fake.base_url, KEY)
        yield fake, provider
        await provider.close()


async def failure(provider, req: ModelRequest | None = None) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await provider.complete(req or request())
    assert KEY not in str(info.value)
    return info.value


# --- OpenAI -------------------------------------------------------------------------------


async def test_openai_stream_text_deltas_in_order(oai):
    fake, provider = oai
    fake.script_text("one two three four")
    deltas: list[str] = []
    resp = await provider.complete(request(system_dynamic="Now: 12:00"), deltas.append)
    assert deltas == ["one ", "two ", "three ", "four"]
    assert resp.text == "one two three four"
    assert (resp.stop_reason, resp.provider, resp.api) == ("stop", "openai", "openai")
    assert resp.usage.output_tokens > 0 and resp.usage.input_tokens > 0
    sent = fake.requests[-1]
    assert sent.json["stream"] is True
    assert sent.json["stream_options"] == {"include_usage": True}
    assert sent.json["messages"][0] == {
        "role": "system", "content": "You are tidegate.\n\nNow: 12:00"
    }
    assert sent.headers["authorization"] == f"Bearer {KEY}"


async def test_openai_non_stream_and_async_callback(oai):
    fake, provider = oai
    fake.script_text("plain answer")
    resp = await provider.complete(request(stream=False), None)
    assert resp.text == "plain answer" and resp.stop_reason == "stop"
    assert "stream" not in fake.requests[-1].json

    seen: list[str] = []

    async def on_delta(chunk: str) -> None:
        await asyncio.sleep(0)
        seen.append(chunk)

    resp = await provider.complete(request("ping"), on_delta)  # default responder echoes
    assert resp.text == "echo: ping" and "".join(seen) == "echo: ping"


async def test_openai_repeated_system_prompt_reports_cache_reads(oai):
    _, provider = oai
    first = await provider.complete(request())
    second = await provider.complete(request())
    assert first.usage.cache_read_tokens == 0
    assert second.usage.cache_read_tokens > 0


@pytest.mark.parametrize("stream", [True, False])
async def test_openai_tool_call_round_trip(oai, stream):
    fake, provider = oai
    fake.script_tool_call("write", {"path": "a.txt", "content": "x" * 40}, call_id="call_abc")
    resp = await provider.complete(request("write it", tools=[WRITE], stream=stream))
    assert resp.stop_reason == "tool_use"
    assert [(c.id, c.name, c.arguments) for c in resp.tool_calls] == [
        ("call_abc", "write", {"path": "a.txt", "content": "x" * 40})
    ]
    assert fake.requests[-1].json["tools"] == [{
        "type": "function",
        "function": {"name": "write", "description": "Write a file",
                     "parameters": WRITE.parameters},
    }]

    fake.script_text("done")
    resp = await provider.complete(
        ModelRequest(model="m", system="S", messages=tool_history(), stream=stream)
    )
    assert resp.text == "done"
    messages = fake.requests[-1].json["messages"]
    assistant = messages[2]
    assert assistant["role"] == "assistant" and assistant["content"] == "Writing."
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_1", "call_2"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {
        "path": "a.txt", "content": "é"
    }
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "wrote a.txt"},
        {"role": "tool", "tool_call_id": "call_2", "content": "disk full"},
    ]


async def test_openai_parallel_tool_calls_assembled_by_index(oai):
    fake, provider = oai
    fake.script_tool_calls([
        {"name": "write", "arguments": {"path": "a"}},
        {"name": "read", "arguments": {"path": "b"}},
    ], text="Two calls.")
    resp = await provider.complete(request(tools=[WRITE]))
    assert resp.text == "Two calls."
    assert [(c.name, c.arguments) for c in resp.tool_calls] == [
        ("write", {"path": "a"}), ("read", {"path": "b"})
    ]
    assert len({c.id for c in resp.tool_calls}) == 2


async def test_openai_long_foreign_tool_ids_are_shortened_consistently(oai):
    fake, provider = oai
    long_id = "toolu_" + "x" * 60
    history = [
        ChatMessage("user", "go"),
        ChatMessage("assistant", "", tool_calls=[ToolCall(long_id, "write", {})]),
        ChatMessage("tool", "ok", tool_call_id=long_id),
    ]
    await provider.complete(ModelRequest(model="m", system="", messages=history))
    sent = fake.requests[-1].json["messages"]  # the fake rejects ids > 40 chars with a 400
    assert sent[0]["role"] == "user"  # no empty system message
    assert sent[1]["content"] is None
    assert sent[1]["tool_calls"][0]["id"] == sent[2]["tool_call_id"]


@pytest.mark.parametrize("stream", [True, False])
async def test_openai_malformed_tool_arguments_do_not_crash(oai, stream):
    fake, provider = oai
    fake.script_tool_call("write", '{"path": "a.txt", "content": ')
    resp = await provider.complete(request(tools=[WRITE], stream=stream))
    assert resp.tool_calls[0].arguments == {
        "_raw": '{"path": "a.txt", "content": ', "_error": "invalid JSON"
    }


async def test_openai_429_is_transient_with_retry_after_and_not_retried(oai):
    fake, provider = oai
    fake.script_error(429, retry_after=1)
    err = await failure(provider)
    assert (err.transient, err.status, err.retry_after, err.kind) == (True, 429, 1.0, "rate_limit")
    assert len(fake.requests) == 1  # SDK retries are off: the runtime owns retry policy


async def test_openai_500_transient_401_not(oai):
    fake, provider = oai
    fake.script_error(500)
    err = await failure(provider)
    assert (err.transient, err.status, err.kind) == (True, 500, "transient")

    fake.script_error(401)  # the fake echoes the presented key back in its message
    with capture_logs() as logs:
        err = await failure(provider)
    assert (err.transient, err.status, err.kind) == (False, 401, "auth")
    assert "Incorrect API key provided: ***" in str(err)
    assert logs and KEY not in repr(logs)


async def test_openai_wrong_key_and_context_overflow(oai):
    fake, provider = oai
    fake.api_key = "the-right-key"
    err = await failure(provider)
    assert err.kind == "auth" and not err.transient

    fake.api_key = None
    fake.script_error(400, message="This model's maximum context length is 128000 tokens.",
                      error_type="invalid_request_error")
    err = await failure(provider)
    assert (err.kind, err.transient, err.status) == ("context_overflow", False, 400)


async def test_openai_invalid_history_is_bad_request(oai):
    _, provider = oai
    orphan = [ChatMessage("user", "x"), ChatMessage("tool", "result", tool_call_id="nope")]
    err = await failure(provider, ModelRequest(model="m", system="S", messages=orphan))
    assert (err.kind, err.transient, err.status) == ("invalid_request", False, 400)


async def test_openai_cut_stream_is_transient_after_partial_deltas(oai):
    fake, provider = oai
    fake.script_cut_stream("partial answer that")
    deltas: list[str] = []
    with pytest.raises(ProviderError) as info:
        await provider.complete(request(), deltas.append)
    assert info.value.transient and info.value.kind == "connection"
    assert "".join(deltas) == "partial answer that"

    fake.script_cut_stream()
    err = await failure(provider, request(stream=False))
    assert err.transient


async def test_openai_error_inside_stream_is_transient(oai):
    fake, provider = oai
    fake.script_stream_error("server_error", "The server had an error")
    err = await failure(provider)
    assert err.transient and err.status is None and "The server had an error" in str(err)


async def test_openai_connection_refused_is_transient():
    async with FakeOpenAI() as fake:
        url = fake.base_url
    provider = OpenAIProvider("openai", url, KEY)
    try:
        err = await failure(provider)
        assert (err.transient, err.kind) == (True, "connection")
    finally:
        await provider.close()


async def test_openai_call_timeout_uses_the_clock():
    clock = FakeClock()
    async with FakeOpenAI() as fake:
        provider = OpenAIProvider("openai", fake.base_url, KEY, headers={"X-Team": "t1"},
                                  clock=clock)
        fake.script_hang()
        task = asyncio.create_task(provider.complete(request(timeout=30.0)))
        for _ in range(500):
            if fake.requests:
                break
            await asyncio.sleep(0.005)
        assert fake.requests[0].headers["x-team"] == "t1"
        await clock.advance(29.0)
        assert not task.done()
        await clock.advance(1.0)
        with pytest.raises(ProviderError) as info:
            await task
        assert (info.value.kind, info.value.transient) == ("timeout", True)
        await provider.close()


# --- Anthropic ----------------------------------------------------------------------------


async def test_anthropic_stream_system_blocks_and_cache_usage(ant):
    fake, provider = ant
    fake.script_text("alpha beta gamma")
    deltas: list[str] = []
    req = request(system="stable prefix " * 50, system_dynamic="Now: 12:00")
    first = await provider.complete(req, deltas.append)
    assert deltas == ["alpha ", "beta ", "gamma"] and first.text == "alpha beta gamma"
    assert (first.stop_reason, first.api) == ("stop", "anthropic")
    sent = fake.requests[-1].json
    assert sent["system"] == [
        {"type": "text", "text": "stable prefix " * 50, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Now: 12:00"},
    ]
    assert sent["stream"] is True and sent["max_tokens"] == 4096
    assert first.usage.cache_write_tokens > 0 and first.usage.cache_read_tokens == 0

    second = await provider.complete(
        request(system="stable prefix " * 50, system_dynamic="Now: 12:05"))
    assert second.usage.cache_read_tokens == first.usage.cache_write_tokens
    assert second.usage.input_tokens >= second.usage.cache_read_tokens


async def test_anthropic_non_stream_and_no_system(ant):
    fake, provider = ant
    fake.script_text("plain")
    resp = await provider.complete(request(system="", stream=False))
    assert resp.text == "plain"
    assert "system" not in fake.requests[-1].json and "stream" not in fake.requests[-1].json


@pytest.mark.parametrize("stream", [True, False])
async def test_anthropic_tool_call_round_trip(ant, stream):
    fake, provider = ant
    fake.script_tool_call("write", {"path": "a.txt", "content": "x" * 30}, call_id="toolu_1")
    resp = await provider.complete(request(tools=[WRITE], stream=stream))
    assert resp.stop_reason == "tool_use"
    assert [(c.id, c.name, c.arguments) for c in resp.tool_calls] == [
        ("toolu_1", "write", {"path": "a.txt", "content": "x" * 30})
    ]
    assert fake.requests[-1].json["tools"] == [
        {"name": "write", "description": "Write a file", "input_schema": WRITE.parameters}
    ]

    fake.script_text("done")
    resp = await provider.complete(
        ModelRequest(model="m", system="S", messages=tool_history(), stream=stream))
    assert resp.text == "done"
    messages = fake.requests[-1].json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Writing."},
        {"type": "tool_use", "id": "call_1", "name": "write",
         "input": {"path": "a.txt", "content": "é"}},
        {"type": "tool_use", "id": "call_2", "name": "write", "input": {"path": "b.txt"}},
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "wrote a.txt"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "disk full",
         "is_error": True},
    ]


async def test_anthropic_merges_same_role_runs_with_tool_results_first(ant):
    fake, provider = ant
    history = [
        ChatMessage("user", "first"),
        ChatMessage("user", "second"),
        ChatMessage("assistant", "", tool_calls=[ToolCall("functions.write:0", "write", {})]),
        ChatMessage("user", "steer: also b.txt"),  # arrived while the tool ran
        ChatMessage("tool", "ok", tool_call_id="functions.write:0"),
        ChatMessage("assistant", ""),  # empty: dropped
        ChatMessage("user", "and then?"),
    ]
    await provider.complete(ModelRequest(model="m", system="S", messages=history))
    messages = fake.requests[-1].json["messages"]  # the fake enforces strict alternation
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [b["text"] for b in messages[0]["content"]] == ["first", "second"]
    assert messages[1]["content"][0]["id"] == "functions_write_0"
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result", "text", "text"]
    assert messages[2]["content"][0]["tool_use_id"] == "functions_write_0"


async def test_anthropic_malformed_tool_input(ant):
    fake, provider = ant
    fake.script_tool_call("write", '{"path": ')
    resp = await provider.complete(request(tools=[WRITE]))
    assert resp.tool_calls[0].arguments == {"_raw": '{"path": ', "_error": "invalid JSON"}


async def test_anthropic_error_mapping(ant):
    fake, provider = ant
    fake.script_error(429, retry_after=7)
    err = await failure(provider)
    assert (err.transient, err.status, err.retry_after, err.kind) == (True, 429, 7.0, "rate_limit")
    assert len(fake.requests) == 1

    fake.script_error(529)
    err = await failure(provider)
    assert (err.transient, err.status) == (True, 529)

    fake.script_error(401)  # the fake echoes the presented key
    err = await failure(provider)
    assert (err.transient, err.kind) == (False, "auth") and "***" in str(err)

    fake.script_error(400, message="prompt is too long: 210000 tokens > 200000 maximum")
    err = await failure(provider)
    assert (err.kind, err.transient) == ("context_overflow", False)


async def test_anthropic_cut_stream_and_overloaded_event_are_transient(ant):
    fake, provider = ant
    fake.script_cut_stream("half of it")
    deltas: list[str] = []
    with pytest.raises(ProviderError) as info:
        await provider.complete(request(), deltas.append)
    assert info.value.transient and "".join(deltas) == "half of it"

    fake.script_stream_error("overloaded_error", "Overloaded")
    err = await failure(provider)
    assert err.transient and err.status is None and "Overloaded" in str(err)


# --- echo and registry --------------------------------------------------------------------


async def test_echo_provider_explains_and_echoes():
    echo = EchoProvider()
    deltas: list[str] = []
    resp = await echo.complete(request("are you there?"), deltas.append)
    assert len(deltas) == 2 and "".join(deltas) == resp.text
    assert "no model configured" in resp.text and "You said: are you there?" in resp.text
    assert "agents.defaults.model" in resp.text and "models.providers" in resp.text
    assert resp.tool_calls == [] and resp.stop_reason == "stop"
    assert resp.usage.output_tokens == (len(resp.text) + 3) // 4
    assert (echo.name, echo.api, resp.provider) == ("echo", "echo", "echo")


def test_parse_model_ref():
    assert parse_model_ref("openai/gpt-4o") == ("openai", "gpt-4o")
    assert parse_model_ref("openrouter/meta-llama/llama-3") == ("openrouter", "meta-llama/llama-3")
    for bad in ("gpt-4o", "openai/", "/gpt-4o", ""):
        with pytest.raises(ValueError, match="<provider>/<model>"):
            parse_model_ref(bad)


async def test_registry_lazy_cached_and_keyless_local_server():
    async with FakeOpenAI() as oai_fake, FakeAnthropic() as ant_fake:
        registry = ProviderRegistry({
            "local": {"api": "openai", "base_url": oai_fake.base_url, "api_key": None},
            "claude": {"api": "anthropic", "baseUrl": ant_fake.base_url, "apiKey": KEY},
        })
        assert registry.names == ["claude", "local", "echo"]
        provider, model = registry.resolve("local/llama3:8b")
        assert registry.get("local") is provider and model == "llama3:8b"
        assert isinstance(registry.get("claude"), AnthropicProvider)
        assert registry.get("echo").api == "echo"
        resp = await provider.complete(ModelRequest(model=model, system="",
                                                    messages=[ChatMessage("user", "hi")]))
        assert resp.text == "echo: hi"
        assert oai_fake.requests[-1].headers["authorization"] == "Bearer not-needed"
        assert oai_fake.requests[-1].json["model"] == "llama3:8b"
        with pytest.raises(KeyError, match="configured providers: claude, local"):
            registry.get("nope")
        await registry.close()


def test_registry_rejects_bad_config():
    with pytest.raises(ValueError, match=r"models\.providers\.x\.api"):
        ProviderRegistry({"x": {"api": "gemini"}})
    with pytest.raises(ValueError, match="unknown key"):
        ProviderRegistry({"x": {"api": "openai", "base": "http://h"}})
    with pytest.raises(ValueError, match="echo"):
        ProviderRegistry({"echo": {"api": "openai"}})


# --- the fakes from other threads and processes -------------------------------------------


async def test_fake_in_thread_scripted_over_http():
    running = FakeAnthropic.start_in_thread()
    provider = AnthropicProvider("anthropic", running.base_url, KEY)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{running.base_url}/_script",
                                 json=[{"type": "text", "text": "from afar"}]) as r:
                assert (await r.json()) == {"queued": 1}
            resp = await provider.complete(request())
            assert resp.text == "from afar"
            async with http.get(f"{running.base_url}/_requests") as r:
                recorded = await r.json()
        assert recorded[-1]["path"] == "/v1/messages"
        assert recorded[-1]["json"]["messages"][0]["content"][0]["text"] == "hello"
    finally:
        await provider.close()
        running.stop()


async def test_fake_openai_standalone_process(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"type": "text", "text": "scripted reply"}]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.fake_openai", "--port", "0", "--script", str(script),
        cwd=REPO, stdout=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
        assert line.startswith("READY http://127.0.0.1:")
        provider = OpenAIProvider("openai", line.split()[1], KEY)
        try:
            resp = await provider.complete(request())
        finally:
            await provider.close()
        assert resp.text == "scripted reply"
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 5) == 0


def test_wire_cache_is_per_message_and_not_copied():
    import dataclasses

    from runtime.providers.openai_provider import encoded_messages

    msg = ChatMessage("user", "hello")
    req = ModelRequest(model="m", system="", messages=[msg])
    assert encoded_messages(req) == [b'{"role":"user","content":"hello"}']
    assert msg.wire["openai"] == b'{"role":"user","content":"hello"}'
    copy = dataclasses.replace(msg, content="changed")  # e.g. image parts added for a call
    assert copy.wire == {}
    assert encoded_messages(ModelRequest(model="m", system="", messages=[copy])) == [
        b'{"role":"user","content":"changed"}']


def test_system_message_bytes_follow_the_prompt_when_its_prefix_is_cached():
    """The stable prefix's encoding is kept between turns; an edited prefix (a bootstrap
    file changed) or a new per-turn block is what goes out, byte for byte what json
    would encode."""
    from runtime.providers.openai_provider import encoded_messages, to_openai_messages

    def wire(system: str, dynamic: str) -> list[bytes]:
        req = ModelRequest(model="m", system=system, system_dynamic=dynamic,
                           messages=[ChatMessage("user", "hi")])
        expected = [json.dumps(m, ensure_ascii=False, separators=(",", ":")).encode()
                    for m in to_openai_messages(req)]
        got = encoded_messages(req)
        assert got == expected
        return got

    prefix = "# Identity\n" + "You are main. \"quoted\" \\ 中文 \u2028\x00\n" * 60
    first = wire(prefix, "Time: 10:00")
    assert wire(prefix, "Time: 10:01")[0] != first[0]
    edited = wire(prefix.replace("main", "mine"), "Time: 10:01")[0]
    assert b"You are mine." in edited and b"You are main." not in edited
    assert wire(prefix, "")[0].endswith(b'\\u0000\\n"}')
    assert wire("", "only dynamic")[0] == b'{"role":"system","content":"only dynamic"}'
    assert wire("", "") == [b'{"role":"user","content":"hi"}']
