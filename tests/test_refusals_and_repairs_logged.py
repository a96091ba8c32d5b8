"""Every refused tool call and every automatic repair of stored data leaves one structured
log record with the session key (issue 8 "General rules")."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from tests.channel_harness import log_events
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(30)

KEY = "agent:main:cli:dm:local"


async def test_path_escape_and_unknown_tool_are_logged_with_the_session_key(tmp_path, model):
    async with running_gateway(base_config(tmp_path / "state", model.base_url)) as gw:
        model.script_tool_calls([
            {"name": "read", "arguments": {"path": "../../../etc/passwd"}},
            {"name": "write", "arguments": {"path": "/tmp/outside.txt", "content": "x"}},
            {"name": "shell_escape", "arguments": {}}])
        model.script_text("I cannot do that.")
        with capture_logs() as logs:
            result = await gw.local.send("read /etc/passwd", session_key=KEY)
        assert result.text == "I cannot do that."
        refused = log_events(logs, "tool_call_refused")
        assert [(r["tool"], r["session_key"]) for r in refused] == [
            ("read", KEY), ("write", KEY), ("shell_escape", KEY)]
        assert "outside the workspace" in refused[0]["reason"]
        assert not (tmp_path / "outside.txt").exists()


async def test_torn_line_and_dangling_tool_call_repairs_are_logged(tmp_path, model):
    cfg = base_config(tmp_path / "state", model.base_url)
    async with running_gateway(cfg) as gw:
        model.script_text("first")
        result = await gw.local.send("hello", session_key=KEY)
        session_id = result.session_id
    path = tmp_path / "state/agents/main/sessions" / f"{session_id}.jsonl"
    # a turn killed while its tool ran (call without result), then a torn last line
    path.write_bytes(path.read_bytes()
                     + b'{"type":"message","id":"aaaa0001","parentId":null,"timestamp":'
                     b'"2026-12-01T00:00:00.000Z","message":{"role":"assistant","content":'
                     b'[{"type":"toolCall","id":"call_1","name":"exec","arguments":{}}],'
                     b'"timestamp":1}}\n{"type":"message","id":"bbbb')
    async with running_gateway(cfg) as gw:
        model.script_text("second")
        with capture_logs() as logs:
            assert (await gw.local.send("again", session_key=KEY)).text == "second"
    [skipped] = log_events(logs, "transcript_lines_skipped")
    [repaired] = log_events(logs, "transcript_tool_pairs_repaired")
    assert skipped["session_key"] == repaired["session_key"] == KEY
    assert repaired["results_added"] == 1
