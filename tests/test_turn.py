"""The one turn loop (issue 2 §7) through the in-process gateway and a fake model speaking
the real OpenAI protocol: runtime events, tool errors, timeouts, loop detection, retries,
failover, steering and the prompt layout."""

import asyncio

from runtime.events import RuntimeEvent
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway


def cfg(tmp_path, url, **agent):
    return base_config(tmp_path / "state", url,
                       agents={"defaults": {"model": "fake/fake-model", **agent}})


async def test_runtime_events_in_order_and_tool_errors_go_back_to_the_model(tmp_path):
    async with FakeOpenAI() as fake, running_gateway(cfg(tmp_path, fake.base_url)) as gw:
        seen: list[RuntimeEvent] = []
        gw.bus.subscribe(seen.append)
        fake.script_tool_call("read", {"path": "../../etc/passwd"}, call_id="c1")
        fake.script_text("cannot read that")
        result = await gw.local.send("read the password file")
        assert result.status == "ok" and result.text == "cannot read that"
        types = [e.type for e in seen if e.run_id == result.run_id]
        assert types[0] == "agent_start" and types[-1] == "agent_end"
        assert types.index("tool_execution_start") < types.index("tool_execution_end")
        assert types.count("message_start") == 2 and types.count("message_end") == 2
        assert "message_update" in types
        tool_result = [m for m in fake.requests[-1].json["messages"] if m["role"] == "tool"]
        assert "outside the workspace" in tool_result[0]["content"]


async def test_system_prompt_is_byte_stable_and_per_turn_data_follows_it(tmp_path):
    async with FakeOpenAI() as fake, running_gateway(cfg(tmp_path, fake.base_url)) as gw:
        ws = gw.config.workspace_for("main")
        (ws / "SOUL.md").write_text("You love tide tables.")
        await gw.local.send("one")
        await gw.local.send("two")
        s1, s2 = (r.json["messages"][0]["content"] for r in fake.requests[-2:])
        prefix1, prefix2 = s1.split("# Time Awareness")[0], s2.split("# Time Awareness")[0]
        assert prefix1 == prefix2 and "You love tide tables." in prefix1
        assert "Current time:" in s1.split("# Time Awareness")[1]
        agent = gw.agents["main"]
        rebuilds = agent.prompt.rebuilds
        await gw.local.send("three")
        assert agent.prompt.rebuilds == rebuilds  # no file changed: prefix not rebuilt


async def test_turn_timeout_keeps_the_transcript_valid(tmp_path):
    async with FakeOpenAI() as fake:
        config = cfg(tmp_path, fake.base_url, timeout="1s")
        async with running_gateway(config) as gw:
            fake.script_tool_call("exec", {"command": "sleep 30"}, call_id="slow")
            result = await gw.local.send("run something slow")
            assert result.status == "timeout" and "timed out" in result.text
            fake.script_text("ok now")
            again = await gw.local.send("hello?")
            assert again.text == "ok now"
            msgs = fake.requests[-1].json["messages"]
            call_idx = next(i for i, m in enumerate(msgs) if m.get("tool_calls"))
            assert msgs[call_idx + 1]["role"] == "tool"
            assert "timed out" in msgs[call_idx + 1]["content"]


async def test_transient_errors_retry_then_fail_over(tmp_path):
    async with FakeOpenAI() as primary, FakeOpenAI() as backup:
        config = base_config(tmp_path / "state")
        config["models"] = {"retries": 1, "retry_backoff": "10ms", "providers": {
            "p": {"api": "openai", "base_url": primary.base_url, "api_key": "k1"},
            "b": {"api": "openai", "base_url": backup.base_url, "api_key": "k2"}}}
        config["agents"] = {"defaults": {"model": {"primary": "p/m1", "fallbacks": ["b/m2"]}}}
        async with running_gateway(config) as gw:
            primary.script_error(500)
            primary.script_text("recovered")
            r1 = await gw.local.send("first")
            assert r1.text == "recovered" and len(primary.requests) == 2
            primary.script_error(401)
            backup.script_text("from the backup")
            r2 = await gw.local.send("second")
            assert r2.text == "from the backup" and r2.model == "m2"
            assert len(primary.requests) == 3  # 401 is not retried


async def test_steer_mode_keeps_an_awaited_request_a_turn_of_its_own(tmp_path):
    """Steering injects only a message with the running turn's reply route (a platform
    chat: tests/test_lanes.py); a second awaited request (``agent -m``) on the same session
    waits and gets its own turn and its own answer, in order."""
    async with FakeOpenAI() as fake:
        config = cfg(tmp_path, fake.base_url)
        config["messages"] = {"queue": {"mode": "steer", "debounce": 0}}
        async with running_gateway(config) as gw:
            fake.push({"type": "tool_calls", "calls": [
                {"name": "exec", "arguments": {"command": "sleep 0.3"}}], "delay": 0.05})
            fake.script_text("done with the task")
            fake.script_text("sunny")
            first = gw.local.submit("start a task")
            while len(fake.requests) < 1:
                await asyncio.sleep(0.01)
            second = gw.local.submit("also mention the weather")
            r1, r2 = await asyncio.gather(first.future, second.future)
            assert (r1.text, r2.text) == ("done with the task", "sunny")
            assert len(fake.requests) == 3
            steered = [m["content"] for m in fake.requests[1].json["messages"]
                       if m["role"] == "user"]
            assert steered[-1] == "start a task"  # nothing injected into the first turn
            users = [m["content"] for m in fake.requests[2].json["messages"]
                     if m["role"] == "user"]
            assert users[-2:] == ["start a task", "also mention the weather"]


async def test_collect_mode_runs_awaited_requests_in_order_each_answered(tmp_path):
    """Three awaited requests at once on one session: three turns in arrival order, each
    caller gets its own answer (platform messages of one chat are what collect merges)."""
    async with FakeOpenAI() as fake:
        config = cfg(tmp_path, fake.base_url)
        config["messages"] = {"queue": {"mode": "collect", "debounce": "200ms"}}
        async with running_gateway(config) as gw:
            for answer in ("one", "two", "three"):
                fake.script_text(answer)
            subs = [gw.local.submit(t) for t in ("hey", "are you there", "question:")]
            results = await asyncio.gather(*(s.future for s in subs))
            assert [r.text for r in results] == ["one", "two", "three"]
            assert len(fake.requests) == 3
            users = [m["content"] for m in fake.requests[-1].json["messages"]
                     if m["role"] == "user"]
            assert users == ["hey", "are you there", "question:"]


async def test_auto_compaction_summarises_old_context_and_keeps_the_file(tmp_path):
    async with FakeOpenAI() as fake:
        config = cfg(tmp_path, fake.base_url, context_tokens=3000, max_tokens=200,
                     context_guard={"min": 0, "warn_below": 0})
        async with running_gateway(config) as gw:
            seen = []
            gw.bus.subscribe(lambda e: seen.append(e.type))
            for i in range(12):
                fake.script_text(f"answer {i} " + "x" * 400)
                await gw.local.send(f"question {i} " + "y" * 400)
            assert "auto_compaction_start" in seen and "auto_compaction_end" in seen
            summary_reqs = [r.json for r in fake.requests
                            if "compress conversations" in r.json["messages"][0]["content"]]
            assert summary_reqs and "question 0" in summary_reqs[0]["messages"][1]["content"]
            last = fake.requests[-1].json["messages"]
            assert any("[Summary of the earlier conversation]" in str(m.get("content"))
                       for m in last)
            assert not any("question 0 " in str(m.get("content")) for m in last
                           if m["role"] == "user" and "Summary" not in str(m["content"]))
            entry = gw.agents["main"].store.get("agent:main:cli:dm:local")
            path = gw.state_dir / "agents/main/sessions" / f"{entry.session_id}.jsonl"
            text = path.read_text()
            assert '"type":"compaction"' in text
            assert "question 0 " in text  # the file itself is never rewritten
            await gw.timeline_hooks.flush()
            events = await gw.timeline_hooks.timeline.get_timeline(entry.session_id)
            assert any(e.event_type == "COMPACTION" for e in events)


async def test_a_message_larger_than_the_context_is_truncated_not_dropped(tmp_path):
    async with FakeOpenAI() as fake:
        config = cfg(tmp_path, fake.base_url, context_tokens=6000, max_tokens=500,
                     context_guard={"min": 0, "warn_below": 0})
        async with running_gateway(config) as gw:
            fake.script_text("got it")
            result = await gw.local.send("START " + "B" * 60_000 + " END")
            assert result.text == "got it"
            users = [m["content"] for m in fake.requests[-1].json["messages"]
                     if m["role"] == "user"]
            assert users and users[-1].startswith("START ")
            assert "message truncated" in users[-1] and "END" not in users[-1]
