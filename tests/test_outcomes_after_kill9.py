"""Outcomes that survive a ``kill -9`` (docs/outcomes.md): a message's ``OUTCOME`` timeline
event is durable (and shown by ``tidegate timeline show`` from another shell) as soon
as the outcome is recorded, not held for the session's next write; a message of the
OpenAI API whose caller the process died on ends ``failed`` at the next start, and an
accepted local message without an outcome counts as unresolved like a platform one."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from gateway.journal.local import LOST_DETAIL
from gateway.journal.recorder import OutcomeRecorder
from gateway.journal.store import FILE_NAME as JOURNAL_FILE
from gateway.journal.store import IntakeJournal
from runtime.clock import FakeClock
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess, base_config

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def model():
    running = FakeOpenAI.start_in_thread()
    yield running.server
    running.stop()


def _wait(cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _timeline(gp: GatewayProcess, key: str) -> list[dict]:
    return json.loads(gp.cli("timeline", "show", key, "--json").stdout)["events"]


def test_outcome_event_is_durable_and_visible_once_recorded(tmp_path, model):
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state", model.base_url)).start()
    try:
        model.script_text("Mars.")
        key = gp.agent("which planet is red?")["session_key"]
        # another shell sees it while the gateway runs (no later event carries it)
        kinds = [e["event_type"] for e in _timeline(gp, key)]
        assert kinds[-3:] == ["USER_INPUT", "LLM_RESPONSE", "OUTCOME"], kinds
    finally:
        gp.kill9()
    [outcome] = [e for e in _timeline(gp, key) if e["event_type"] == "OUTCOME"]
    assert outcome["content"]["outcome"] == "replied"


def _post(port: int, token: str, out: dict) -> None:
    body = json.dumps({"model": "main", "user": "k9",
                       "messages": [{"role": "user", "content": "slow one"}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"Authorization": f"Bearer {token}",
                                  "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            out["status"] = r.status
    except (urllib.error.URLError, ConnectionError, OSError) as exc:
        out["error"] = exc


def test_api_message_cut_by_kill9_ends_failed_at_the_next_start(tmp_path, model):
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state", model.base_url)).start()
    key = "agent:main:openai:dm:k9"
    caller: dict = {}
    try:
        model.script_text("warm-up")
        gp.agent("hello", "--session-key", key)  # the session exists before the cut turn
        model.script_hang()
        thread = threading.Thread(target=_post, args=(gp.port, gp.token, caller))
        thread.start()
        _wait(lambda: len([r for r in model.requests
                           if r.path.endswith("/chat/completions")]) == 2, "the turn")
    finally:
        gp.kill9()
    thread.join(10)
    assert "error" in caller  # the connection dropped: no answer
    gp.start()
    try:
        rows = json.loads(gp.cli("sessions", "outcomes", key, "--json").stdout)
        rows = rows["outcomes"] if isinstance(rows, dict) else rows
        assert [(r["outcome"], r["detail"]) for r in rows] == [
            ("replied", ""), ("failed", LOST_DETAIL)]
        outcomes = [e["content"]["outcome"] for e in _timeline(gp, key)
                    if e["event_type"] == "OUTCOME"]
        assert outcomes == ["replied", "failed"]
        status = json.loads(gp.cli("status", "--json").stdout)
        assert status["outcomes"]["unresolved"] == 0
    finally:
        assert gp.stop() == 0
    gp.start()  # recorded once: not again at a later start
    try:
        rows = json.loads(gp.cli("sessions", "outcomes", key, "--json").stdout)
        rows = rows["outcomes"] if isinstance(rows, dict) else rows
        assert [r["outcome"] for r in rows] == ["replied", "failed"]
    finally:
        assert gp.stop() == 0


def test_unresolved_counts_local_messages_and_compaction_keeps_them(tmp_path):
    clock = FakeClock()
    path = tmp_path / JOURNAL_FILE
    journal = IntakeJournal(path, clock, fsync=False, compact_after=1)
    journal.load()
    rec = OutcomeRecorder(clock, journal)
    row = {"session_key": "agent:main:openai:dm:u", "channel": "openai", "agent": "main",
           "run_id": "r1"}
    lost, answered = journal.accept_local(row), journal.accept_local(row)
    rec.record_message({"channel": "openai", "agent": "main", "local_id": answered},
                       "replied", session_key=row["session_key"])
    clock.set_wall(clock.time() + 601)
    assert rec.unresolved(lambda e: 600.0) == 1
    journal.close()
    again = IntakeJournal(path, clock, fsync=False, compact_after=1)
    again.load()  # compacts: the open local record is written back
    assert [e.id for e in again.local_unfinished()] == [lost]
    assert OutcomeRecorder(clock, again).unresolved(lambda e: 600.0) == 1
    again.close()
