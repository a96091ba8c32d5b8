"""JSONL transcripts: format, append-only, torn lines, tail reading, context fitting."""

import json
import os

from runtime.clock import FakeClock
from runtime.context.budget import MISSING_RESULT, fit_to_budget
from runtime.context.messages import assistant_message, tool_result_message, user_message
from runtime.context.session_log import HeldLog, SessionLog
from runtime.providers.base import ChatMessage, ToolCall
from runtime.transcript import TranscriptWriter, read_tail


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_header_and_entries_match_openclaw_v3_shape(tmp_path):
    path = tmp_path / "s1.jsonl"
    w = TranscriptWriter(path, session_id="s1", session_key="agent:main:main",
                         clock=FakeClock()).open()
    e1 = w.append_message(user_message("hi", 1767225600000))
    call = ToolCall("call_1", "write", {"path": "a.txt", "content": "x"})
    e2 = w.append_message(assistant_message("", [call], 1767225601000, model="m"))
    e3 = w.append_message(tool_result_message(call, "ok", False, 1767225602000))
    rows = lines(path)
    assert rows[0] == {"type": "session", "version": 3, "id": "s1",
                       "timestamp": "2026-01-01T00:00:00.000Z",
                       "session_key": "agent:main:main"}
    assert [r["id"] for r in rows[1:]] == [e1["id"], e2["id"], e3["id"]]
    assert [r["parentId"] for r in rows[1:]] == [None, e1["id"], e2["id"]]
    assert rows[1]["timestamp"] == "2026-01-01T00:00:00.000Z"
    assert rows[2]["message"]["content"][0] == {"type": "toolCall", "id": "call_1",
                                                "name": "write",
                                                "arguments": {"path": "a.txt", "content": "x"}}
    assert rows[3]["message"]["toolCallId"] == "call_1"


def test_reopen_continues_the_parent_chain(tmp_path):
    path = tmp_path / "s.jsonl"
    w = TranscriptWriter(path, session_id="s", session_key="k").open()
    last = w.append_message(user_message("one", 1))
    w.close()
    w2 = TranscriptWriter(path, session_id="s", session_key="k").open()
    e = w2.append_message(user_message("two", 2))
    assert e["parentId"] == last["id"]
    assert sum(1 for r in lines(path) if r["type"] == "session") == 1


def test_torn_last_line_is_skipped_and_next_append_starts_fresh(tmp_path):
    path = tmp_path / "s.jsonl"
    w = TranscriptWriter(path, session_id="s", session_key="k").open()
    good = w.append_message(user_message("intact", 1))
    w.close()
    before = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(b'{"type":"message","id":"torn","mess')  # crash mid-write
    w2 = TranscriptWriter(path, session_id="s", session_key="k").open()
    w2.append_message(user_message("after crash", 2))
    data = path.read_bytes()
    assert data.startswith(before)  # earlier lines never rewritten
    tail = read_tail(path)
    texts = [e["message"]["content"][0]["text"] for e in tail.entries]
    assert texts == ["intact", "after crash"]
    assert len(tail.skipped) == 1 and "invalid" in tail.skipped[0][1]
    assert tail.entries[1]["parentId"] == good["id"]


def test_tail_reads_only_the_end_of_a_big_file(tmp_path):
    path = tmp_path / "big.jsonl"
    w = TranscriptWriter(path, session_id="s", session_key="k").open()
    for i in range(20000):
        w.append_message(user_message(f"message {i} " + "x" * 100, i))
    w.close()
    tail = read_tail(path, max_bytes=64 * 1024)
    assert not tail.complete and tail.header is None
    assert tail.entries[-1]["message"]["content"][0]["text"].startswith("message 19999 ")
    assert 150 < len(tail.entries) < 300  # ~290-byte lines in a 64 KiB window
    assert tail.skipped == []  # the partial first line is dropped, not reported


def test_fit_to_budget_never_separates_call_and_result():
    call = ToolCall("c1", "read", {"path": "x"})
    msgs = [ChatMessage("user", "old " * 400), ChatMessage("assistant", "", [call]),
            ChatMessage("tool", "r" * 400, tool_call_id="c1", name="read"),
            ChatMessage("assistant", "done"), ChatMessage("user", "next")]
    # Budget fits the tool result but not its call: the result must go too.
    out = fit_to_budget(msgs, 120)
    assert [m.role for m in out] == ["assistant", "user"]
    out = fit_to_budget(msgs, 10_000)
    assert [m.role for m in out] == ["user", "assistant", "tool", "assistant", "user"]


def test_missing_tool_result_gets_a_synthetic_one():
    call = ToolCall("c1", "exec", {"command": "sleep 100"})
    out = fit_to_budget([ChatMessage("user", "go"), ChatMessage("assistant", "", [call]),
                         ChatMessage("user", "hello?")], 10_000)
    assert [m.role for m in out] == ["user", "assistant", "tool", "user"]
    assert out[2].content == MISSING_RESULT and out[2].tool_call_id == "c1"


def test_session_log_caches_context_and_held_log_commits_or_discards(tmp_path):
    path = tmp_path / "s.jsonl"
    log = SessionLog(path, session_id="s", session_key="k", clock=FakeClock())
    log.append_message(user_message("a", 1))
    size = os.path.getsize(path)
    held = HeldLog(log)
    held.append_message(user_message("beat", 2))
    held.append_message(assistant_message("HEARTBEAT_OK", [], 3))
    assert os.path.getsize(path) == size
    log.append_message(user_message("other writer", 4))  # someone appends meanwhile
    snapshot = path.read_bytes()
    assert held.discard() == 2
    assert path.read_bytes() == snapshot
    assert [m.content for m in log.messages()] == ["a", "other writer"]
    held.append_message(assistant_message("alert!", [], 5))
    written = held.commit()
    assert written[0]["parentId"] == lines(path)[-2]["id"]
    assert [m.content for m in log.messages()][-1] == "alert!"
    # A fresh log object rebuilds the same context from disk.
    again = SessionLog(path, session_id="s", session_key="k", clock=FakeClock())
    assert [m.content for m in again.messages()] == ["a", "other writer", "alert!"]
