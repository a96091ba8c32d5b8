"""``/think`` on Anthropic (issue 13 "Commands"): extended thinking through the real
``anthropic`` SDK against the fake Messages server, which refuses (HTTP 400) what the API
refuses: a non-default temperature or a budget >= max_tokens with thinking, and a tool loop
continued without the assistant message's signed thinking block.

Asserted: the request bodies the fake received, the reply text and the stream deltas
(never the thinking), the bytes in the state dir (thinking is never persisted).
"""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest
from structlog.testing import capture_logs

from runtime.providers import AnthropicProvider, ChatMessage, ModelRequest, ToolCall, ToolSpec
from tests.fakes import anthropic_thinking
from tests.fakes.fake_anthropic import FakeAnthropic
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(60)

KEY = "sk-ant-test-0123456789"
PLAN = "PLAN-7f3: read notes.txt first, then summarise it."
READ = ToolSpec("read", "Read a file", {"type": "object",
                                        "properties": {"path": {"type": "string"}}})


def messages_requests(fake: FakeAnthropic) -> list[dict]:
    return [r.json for r in fake.requests if r.path == "/v1/messages"]


@pytest.fixture
async def ant():
    async with FakeAnthropic() as fake:
        provider = AnthropicProvider("anthropic", fake.base_url, KEY)
        yield fake, provider
        await provider.close()


# --- the fake refuses what the API refuses ------------------------------------------------

async def test_fake_rejects_what_the_messages_api_rejects_with_thinking():
    async with FakeAnthropic() as fake:
        client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key=KEY, max_retries=0)
        user = [{"role": "user", "content": "hi"}]
        on = {"type": "enabled", "budget_tokens": 2048}
        bad = [
            ({"max_tokens": 4096, "thinking": on, "extra_body": {"temperature": 0.5}},
             "`temperature` may only"),
            ({"max_tokens": 2048, "thinking": on}, "`max_tokens` must be greater"),
            ({"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 512}},
             "greater than or equal to 1024"),
        ]
        for kwargs, message in bad:
            with pytest.raises(anthropic.BadRequestError, match=message):
                await client.messages.create(model="m", messages=user, **kwargs)
        use = {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}
        loop = user + [{"role": "assistant", "content": [use]},
                       {"role": "user", "content": [{"type": "tool_result",
                                                     "tool_use_id": "toolu_1"}]}]
        with pytest.raises(anthropic.BadRequestError, match="must start with a thinking block"):
            await client.messages.create(model="m", max_tokens=4096, thinking=on, messages=loop)
        forged = {"type": "thinking", "thinking": "forged", "signature": "c2ln"}
        loop[1]["content"] = [forged, use]
        with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
            await client.messages.create(model="m", max_tokens=4096, thinking=on, messages=loop)
        loop[1]["content"][0]["signature"] = anthropic_thinking.sign("forged")
        ok = await client.messages.create(model="m", max_tokens=4096, thinking=on,
                                          messages=loop, extra_body={"temperature": 1})
        assert [b.type for b in ok.content] == ["thinking", "text"]
        # thinking off: the loop needs no thinking block, and no thinking comes back
        loop[1]["content"] = [use]
        plain = await client.messages.create(model="m", max_tokens=64, messages=loop,
                                             extra_body={"temperature": 0.2})
        assert [b.type for b in plain.content] == ["text"]
        await client.close()


# --- the provider -------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("level", "budget"), [("low", 1024), ("medium", 4096),
                                               ("high", 16000)])
async def test_think_level_sends_a_thinking_budget_without_temperature(ant, stream, level,
                                                                       budget):
    fake, provider = ant
    fake.push({"type": "text", "text": "The answer is 42.", "thinking": PLAN})
    deltas: list[str] = []
    resp = await provider.complete(ModelRequest(
        model="m", system="S", messages=[ChatMessage("user", "think")], max_tokens=4096,
        temperature=0.3, stream=stream, reasoning=level), deltas.append)
    sent = messages_requests(fake)[-1]
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert sent["max_tokens"] == 4096 + budget and "temperature" not in sent
    assert resp.text == "The answer is 42." and PLAN not in "".join(deltas)
    assert resp.thinking == [{"type": "thinking", "thinking": PLAN,
                              "signature": anthropic_thinking.sign(PLAN)}]


@pytest.mark.parametrize("stream", [True, False])
async def test_think_off_sends_no_thinking_and_keeps_temperature(ant, stream):
    fake, provider = ant
    resp = await provider.complete(ModelRequest(
        model="m", system="S", messages=[ChatMessage("user", "quick")], max_tokens=4096,
        temperature=0.3, stream=stream, reasoning=None))
    sent = messages_requests(fake)[-1]
    assert "thinking" not in sent and sent["temperature"] == 0.3
    assert sent["max_tokens"] == 4096 and resp.thinking == [] and resp.text == "echo: quick"


@pytest.mark.parametrize("stream", [True, False])
async def test_tool_loop_sends_the_thinking_block_back_before_tool_use(ant, stream):
    fake, provider = ant
    fake.push({"type": "tool_calls", "thinking": PLAN, "text": "",
               "calls": [{"id": "toolu_1", "name": "read", "arguments": {"path": "n.txt"}}]})
    fake.push({"type": "text", "text": "Summary: fine.", "thinking": "Now summarise."})
    history = [ChatMessage("user", "summarise n.txt")]

    def ask() -> ModelRequest:
        return ModelRequest(model="m", system="S", messages=history, tools=[READ],
                            stream=stream, reasoning="high")

    first = await provider.complete(ask())
    history += [ChatMessage("assistant", first.text, tool_calls=first.tool_calls,
                            thinking=first.thinking),
                ChatMessage("tool", "all fine", tool_call_id="toolu_1", name="read")]
    second = await provider.complete(ask())  # the fake 400s without the signed block
    assert second.text == "Summary: fine."
    sent = messages_requests(fake)[-1]
    assert sent["thinking"]["budget_tokens"] == 16000
    assert [b["type"] for b in sent["messages"][1]["content"]] == ["thinking", "tool_use"]
    assert sent["messages"][1]["content"][0]["thinking"] == PLAN


async def test_a_loop_without_thinking_blocks_continues_without_thinking(ant):
    """After failover (another provider wrote the tool call) or a transcript read-back the
    assistant message has no thinking block: that call goes without thinking, not a 400."""
    fake, provider = ant
    history = [ChatMessage("user", "go"),
               ChatMessage("assistant", "", tool_calls=[ToolCall("call_9", "read", {})]),
               ChatMessage("tool", "ok", tool_call_id="call_9", name="read")]
    with capture_logs() as logs:
        resp = await provider.complete(ModelRequest(model="m", system="S", messages=history,
                                                    temperature=0.3, reasoning="medium"))
    assert resp.text == "echo: go"
    sent = messages_requests(fake)[-1]
    assert "thinking" not in sent and sent["temperature"] == 0.3
    assert any(e["event"] == "anthropic_thinking_skipped" for e in logs)


# --- through the gateway ------------------------------------------------------------------

def anthropic_config(state: Path, fake: FakeAnthropic) -> dict:
    cfg = base_config(state)
    cfg["models"] = {"providers": {"claude": {"api": "anthropic", "base_url": fake.base_url,
                                              "api_key": KEY}}, "retries": 0}
    cfg["agents"] = {"defaults": {"model": "claude/claude-fake", "temperature": 0.4,
                                  "max_tokens": 2048}}
    return cfg


def state_bytes(state: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(state.rglob("*")) if p.is_file())


@pytest.mark.parametrize("stream", [True, False])
async def test_think_high_session_runs_its_tool_loop_and_never_shows_thinking(tmp_path,
                                                                              stream):
    state = tmp_path / "s"
    async with FakeAnthropic() as fake:
        async with running_gateway(anthropic_config(state, fake)) as gw:
            (gw.agents["main"].workspace / "notes.txt").write_text("milk, eggs")
            reply = await gw.local.send("/think high")
            assert reply.text == "Thinking set to high for this session."
            fake.push({"type": "tool_calls", "thinking": PLAN, "text": "Reading.",
                       "calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]})
            fake.push({"type": "text", "text": "You need milk and eggs.",
                       "thinking": "PLAN-7f3 done: list both items."})
            seen = []
            gw.bus.subscribe(seen.append)
            result = await gw.local.send("what do I need?", stream=stream)
            assert result.status == "ok" and result.text == "You need milk and eggs."
            deltas = "".join(e.data.get("delta", "") for e in seen
                             if e.type == "message_update")
            assert "PLAN-7f3" not in deltas and "milk and eggs" in deltas
            first, second = messages_requests(fake)[-2:]
            for sent in (first, second):
                assert sent["thinking"] == {"type": "enabled", "budget_tokens": 16000}
                assert sent["max_tokens"] == 2048 + 16000 and "temperature" not in sent
            assistant = second["messages"][-2]["content"]
            assert [b["type"] for b in assistant] == ["thinking", "text", "tool_use"]
            assert assistant[0]["thinking"] == PLAN
            assert "milk, eggs" in str(second["messages"][-1]["content"])

            assert (await gw.local.send("/think off")).text == \
                "Thinking set to off for this session."
            fake.script_text("Quick answer.")
            assert (await gw.local.send("and now?", stream=stream)).text == "Quick answer."
            last = messages_requests(fake)[-1]
            assert "thinking" not in last and last["temperature"] == 0.4
            assert last["max_tokens"] == 2048
        assert b"PLAN-7f3" not in state_bytes(state)  # never persisted


async def test_think_reserves_its_budget_out_of_the_context(tmp_path):
    """With /think high the 16,000 thinking tokens come out of the context budget: the
    request carries only the history that fits the rest (here: 20,000-token context,
    2,048 max_tokens), not the history that fits without thinking."""
    async with FakeAnthropic() as fake:
        cfg = anthropic_config(tmp_path / "s", fake)
        cfg["agents"]["defaults"]["context_tokens"] = 20_000
        async with running_gateway(cfg) as gw:
            filler = "tide " * 600  # ~750 tokens per message
            for i in range(12):
                fake.script_text(f"noted {i}")
                assert (await gw.local.send(f"{i} {filler}")).status == "ok"
            fake.script_text("without thinking")
            await gw.local.send("how many?")
            plain = messages_requests(fake)[-1]
            await gw.local.send("/think high")
            fake.push({"type": "text", "text": "with thinking", "thinking": "count them"})
            await gw.local.send("how many now?")
            thinking = messages_requests(fake)[-1]
    assert thinking["thinking"]["budget_tokens"] == 16000
    sent_chars = len(str(thinking["messages"]))
    assert sent_chars // 4 <= 20_000 - 2048 - 16000, sent_chars
    assert len(thinking["messages"]) < len(plain["messages"]) - 10, \
        (len(thinking["messages"]), len(plain["messages"]))
