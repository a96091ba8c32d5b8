"""The timeline wired into the gateway (issue 5 "Wiring"): every turn records its events in
order, session lifecycle opens and ends timelines, and the chain verifies."""

from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway


async def test_conversation_with_tool_calls_is_recorded_in_order(tmp_path):
    async with FakeOpenAI() as fake:
        async with running_gateway(base_config(tmp_path / "state", fake.base_url)) as gw:
            fake.script_tool_call("write", {"path": "a.txt", "content": "hi"}, call_id="c1")
            fake.script_text("done")
            r1 = await gw.local.send("make a.txt")
            fake.script_text("bye")
            await gw.local.send("/new")
            r2 = await gw.local.send("hello again")
            await gw.timeline_hooks.flush()
            tl = gw.timeline_hooks.timeline
            events = await tl.get_timeline(r1.session_id)
            assert [e.event_type for e in events] == [
                "SESSION_CREATE", "USER_INPUT", "LLM_RESPONSE", "TOOL_CALL", "TOOL_RESULT",
                "LLM_RESPONSE", "OUTCOME", "SESSION_END"]
            assert [e.seq for e in events] == list(range(1, 9))
            assert events[1].content["text"] == "make a.txt"
            assert events[3].content == {"id": "c1", "name": "write",
                                         "arguments": {"path": "a.txt", "content": "hi"}}
            assert events[4].content["is_error"] is False
            assert events[5].content["text"] == "done"
            assert events[6].content["outcome"] == "replied"  # the message's one outcome
            assert events[7].content == {"reason": "new"}
            info = await tl.get_info(r1.session_id)
            assert info.status == "archived"
            assert r2.session_id != r1.session_id
            new_events = await tl.get_timeline(r2.session_id)
            assert [e.event_type for e in new_events][:2] == ["SESSION_CREATE", "USER_INPUT"]
            report = await tl.verify()
            assert report.ok and report.sessions_checked == 2
            assert gw.status()["timeline"]["failures"] == 0
