"""The OpenAI-compatible endpoint never dresses an error up as an answer: a failed turn is
an OpenAI error object with a fitting status (driven by the real openai SDK), and 404,
405, a body over the limit and a request without ``model`` answer JSON error objects."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(60)
USER_MSG = [{"role": "user", "content": "hi"}]


async def test_failed_turns_answer_openai_error_objects_with_fitting_statuses(tmp_path):
    async with FakeOpenAI() as fake, running_gateway(
            base_config(tmp_path / "state", fake.base_url)) as gw:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1",
                                    api_key=gw.token, max_retries=0)
        fake.script_error(500, message="upstream exploded")
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(model="tidegate/main", messages=USER_MSG)
        err = info.value
        assert err.status_code == 502
        assert err.body["type"] == "server_error" and err.body["code"] == "provider_error"
        assert "param" in err.body and "upstream exploded" not in err.body["message"]
        assert err.response.headers["X-Session-Key"] == "agent:main:openai:dm:default"

        fake.script_error(500, message="upstream exploded")
        stream = await client.chat.completions.create(model="tidegate/main",
                                                      messages=USER_MSG, stream=True)
        with pytest.raises(openai.APIError, match="trouble"):
            async for _ in stream:
                pass

        fake.script_text("fine again")
        ok = await client.chat.completions.create(model="tidegate/main", messages=USER_MSG)
        assert (ok.choices[0].message.content, ok.choices[0].finish_reason) == (
            "fine again", "stop")
        # last: the rate limit benches the only auth profile for its cooldown (>= 30 s)
        fake.script_error(429, retry_after=30, message="slow down")
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(model="tidegate/main", messages=USER_MSG)
        wait = int(info.value.response.headers["Retry-After"])
        assert wait >= 30 and f"{wait} seconds" in info.value.body["message"]
        assert info.value.body["code"] == "rate_limit_exceeded"
        outcomes = [r["outcome"] for r in gw.journal.outcomes.select()]
        assert outcomes == ["failed", "failed", "replied", "failed"]
        await client.close()

        base, auth = f"http://127.0.0.1:{gw.port}", {"Authorization": f"Bearer {gw.token}"}
        async with aiohttp.ClientSession(headers=auth) as s:
            async def error_of(method: str, path: str, **kw) -> tuple[int, dict]:
                async with s.request(method, base + path, **kw) as r:
                    assert r.content_type == "application/json"
                    return r.status, (await r.json())["error"]
            status, e = await error_of("POST", "/v1/chat/completions",
                                       json={"messages": USER_MSG})
            assert (status, e["param"], e["code"]) == (400, "model",
                                                       "missing_required_parameter")
            status, e = await error_of("GET", "/v1/nope")
            assert (status, e["type"]) == (404, "not_found_error")
            status, e = await error_of("GET", "/v1/chat/completions")
            assert (status, e["code"]) == (405, "method_not_allowed")
            status, e = await error_of("POST", "/v1/chat/completions",
                                       data=b"x" * (5 * 1024 * 1024),
                                       headers={"Content-Type": "application/json"})
            assert (status, e["code"]) == (413, "request_too_large")
            assert set(e) == {"message", "type", "code", "param"}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


async def test_client_tools_the_openai_way(tmp_path):
    """``tools`` in the request are offered to the model beside the agent's own; a call
    to one ends the response with finish_reason tool_calls; the next request's tool
    message is the result the model continues from (what langchain's bind_tools does)."""
    async with FakeOpenAI() as fake, running_gateway(
            base_config(tmp_path / "state", fake.base_url)) as gw:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1",
                                    api_key=gw.token, max_retries=0)
        ask = [{"role": "user", "content": "weather in Oslo?"}]
        fake.script_tool_call("get_weather", {"city": "Oslo"}, call_id="call_w1")
        first = await client.chat.completions.create(model="tidegate/main", messages=ask,
                                                     tools=[WEATHER], user="lc")
        offered = {t["function"]["name"] for t in fake.requests[-1].json["tools"]}
        assert "get_weather" in offered and "read" in offered  # beside the agent's own
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls
        assert (call.id, call.function.name) == ("call_w1", "get_weather")
        assert json.loads(call.function.arguments) == {"city": "Oslo"}

        fake.script_text("It is 3 °C and windy in Oslo.")
        follow = ask + [choice.message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": "call_w1",
                         "content": '{"temp_c": 3, "wind": "strong"}'}]
        second = await client.chat.completions.create(model="tidegate/main",
                                                      messages=follow, tools=[WEATHER],
                                                      user="lc")
        assert second.choices[0].message.content == "It is 3 °C and windy in Oslo."
        assert second.choices[0].finish_reason == "stop"
        sent = fake.requests[-1].json["messages"]
        tool_msgs = [m for m in sent if m["role"] == "tool"]
        assert tool_msgs[-1]["tool_call_id"] == "call_w1"
        assert "temp_c" in json.dumps(tool_msgs[-1]["content"])
        assert sum(1 for m in sent if m["role"] == "user"
                   and "weather in Oslo" in json.dumps(m["content"])) == 1  # not re-asked
        # a client that never sends the result: the call is closed with an error result
        fake.script_tool_call("get_weather", {"city": "Bergen"}, call_id="call_w2")
        await client.chat.completions.create(model="tidegate/main", tools=[WEATHER],
                                             messages=[{"role": "user", "content": "Bergen?"}],
                                             user="lc")
        fake.script_text("ok")
        await client.chat.completions.create(model="tidegate/main", user="lc",
                                             messages=[{"role": "user", "content": "never mind"}])
        closed = [m for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
        assert closed[-1]["tool_call_id"] == "call_w2"
        assert "no result" in json.dumps(closed[-1]["content"])
        with pytest.raises(openai.BadRequestError, match="tools.0"):
            await client.chat.completions.create(model="tidegate/main", messages=ask,
                                                 tools=[{"type": "function",
                                                         "function": {"name": "bad name"}}])
        await client.close()


async def test_a_request_during_shutdown_answers_503_not_500(tmp_path):
    """While the gateway stops (lanes closed, HTTP still up for the running turns), a new
    request used to raise LaneClosed out of the handler: a 500 text page and a traceback
    in the log. Now an OpenAI error object, 503 with Retry-After."""
    async with FakeOpenAI() as fake, running_gateway(
            base_config(tmp_path / "state", fake.base_url)) as gw:
        gw.lanes.close()  # what stop() does first
        auth = {"Authorization": f"Bearer {gw.token}"}
        async with aiohttp.ClientSession(headers=auth) as s, s.post(
                f"http://127.0.0.1:{gw.port}/v1/chat/completions",
                json={"model": "tidegate/main", "messages": USER_MSG}) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"
            err = (await r.json())["error"]
        assert (err["type"], err["code"]) == ("server_error", "shutting_down")
        assert fake.requests == []
