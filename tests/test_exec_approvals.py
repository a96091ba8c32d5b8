"""Exec approvals in the chat (docs/exec.md): the real gateway in-process, the real
TelegramChannel (python-telegram-bot) against the fake Bot API's inline keyboards and
callback queries, and the fake model issuing exec tool calls. Each test asserts what the
approver's chat showed, what the model got back, and what reached disk."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from runtime.approvals.match import exact_pattern, parse_command, pattern_matches
from runtime.approvals.policy import exec_verdict
from runtime.clock import FakeClock
from runtime.tools.config import ExecRules
from tests.channel_harness import log_events, run_cli, until, write_config
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER, APPROVER, STRANGER = 4242, 1001, 666
DM_KEY = f"agent:main:telegram:dm:{USER}"


def config(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, **exec_rules: Any) -> dict:
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
    cfg = base_config(tmp_path / "state", model.base_url, channels={"telegram": section})
    cfg["gateway"]["shutdown_grace"] = "0.5s"
    cfg["tools"] = {"taint": {"owners": [f"telegram:{USER}"]}}
    cfg["agents"]["defaults"]["tools"] = {"exec": {
        "security": "allowlist", "ask": "on-miss", "allowlist": ["echo *"],
        "approvers": [f"telegram:{APPROVER}"], "approval_timeout": "60s", **exec_rules}}
    return cfg


def prompts(tg: FakeTelegram, chat: int = APPROVER) -> list[dict[str, Any]]:
    """The approver's messages that were sent with an inline keyboard (as they are now)."""
    return [tg.messages[k] for k in tg.keyboard_messages if k[0] == chat]


def sent_keyboard(tg: FakeTelegram, prompt: dict[str, Any]) -> list[dict[str, Any]]:
    """The buttons ``prompt`` was sent with."""
    [payload] = [s["payload"] for s in tg.sent if s["method"].lower() == "sendmessage"
                 and s["status"] == 200 and s["payload"].get("reply_markup")
                 and s["payload"]["chat_id"] == prompt["chat"]["id"]
                 and s["payload"]["text"].startswith(prompt["text"].split("\n")[0][:12])]
    return [b for row in payload["reply_markup"]["inline_keyboard"] for b in row]


async def one_prompt(tg: FakeTelegram, n: int = 1) -> dict[str, Any]:
    found = await until(lambda: len(prompts(tg)) >= n and prompts(tg), what="approval prompt")
    return found[n - 1]


def press(tg: FakeTelegram, prompt: dict[str, Any], label: str, user: int) -> str:
    [data] = [b["callback_data"] for row in prompt["reply_markup"]["inline_keyboard"]
              for b in row if b["text"] == label]
    update = tg.press_button(APPROVER, prompt["message_id"], data, user_id=user)
    return update["callback_query"]["id"]


def tool_results(model: FakeOpenAI) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in model.requests:
        for m in (r.json or {}).get("messages", []):
            if m["role"] == "tool":
                out[m["tool_call_id"]] = m["content"]
    return out


def timeline_approvals(state: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(state / "timeline.db")
    try:
        rows = [json.loads(c) for (c,) in conn.execute(
            "SELECT content FROM timeline_events WHERE event_type = 'SYSTEM_EVENT' "
            "ORDER BY timestamp, seq")]
    finally:
        conn.close()
    return [r for r in rows if r.get("kind") == "exec_approval"]


async def test_allowlisted_runs_a_miss_asks_and_only_the_approvers_press_counts(
        tmp_path, model, tg):
    async with running_gateway(config(tmp_path, model, tg)) as gw:
        ws = gw.config.workspace_for("main")
        model.script_tool_call("exec", {"command": "echo allowlisted-ran"}, call_id="c1")
        model.script_tool_call("exec", {"command": "echo once >> count.txt"}, call_id="c2")
        model.script_text("all done")
        with capture_logs() as logs:
            tg.inject_message("please run things", chat_id=USER, user_id=USER)
            prompt = await one_prompt(tg)
            # the allowlisted command ran without a request; the miss asks, naming why
            assert "allowlisted-ran" in tool_results(model)["c1"]
            assert "echo once >> count.txt" in prompt["text"]
            assert "not one plain command" in prompt["text"]
            labels = [b["text"] for row in prompt["reply_markup"]["inline_keyboard"]
                      for b in row]
            assert labels == ["Allow once", "Deny"]  # not plain: nothing to store
            assert not (ws / "count.txt").exists()  # the turn waits
            # a stranger's press is refused, answered only to them, and logged
            qid = press(tg, prompt, "Allow once", STRANGER)
            await until(lambda: tg.callback_queries.get(qid), what="stranger answered")
            assert tg.callback_queries[qid]["text"] == \
                "Only an approver can answer this request."
            # a forged update whose user id is the string "1001 " is nobody
            qid = press(tg, prompt, "Allow once", f"{APPROVER} ")  # type: ignore[arg-type]
            await until(lambda: tg.callback_queries.get(qid), what="forged id answered")
            assert tg.callback_queries[qid]["text"] == \
                "Only an approver can answer this request."
            assert not (ws / "count.txt").exists()
            # the approver's press runs it, exactly once
            qid = press(tg, prompt, "Allow once", APPROVER)
            await until(lambda: tg.bot_messages(USER), what="the reply")
        assert tg.callback_queries[qid]["text"] == "Allowed once."
        assert [m["text"] for m in tg.bot_messages(USER)] == ["all done"]
        assert (ws / "count.txt").read_text() == "once\n"
        assert tool_results(model)["c2"].startswith("[exit code 0]")
        # the buttons are gone and the prompt says who decided
        assert tg.keyboard(APPROVER, prompt["message_id"]) == []
        assert "Allowed once by telegram:1001" in \
            tg.messages[(APPROVER, prompt["message_id"])]["text"]
        refused, forged = log_events(logs, "approval_press_refused")
        assert refused["by"] == f"telegram:{STRANGER}" and forged["by"] == "telegram:"
        assert len(prompts(tg)) == 1
        # a message from someone who is not an owner taints the turn: even the
        # allowlisted command asks, and says why
        model.script_tool_call("exec", {"command": "echo allowlisted-ran"}, call_id="c3")
        tg.inject_message("run it for me too", chat_id=STRANGER, user_id=STRANGER)
        tainted = await one_prompt(tg, 2)
        assert "the turn is tainted by a message from telegram:666 (not an owner)" in \
            tainted["text"]
        assert [b["text"] for row in tainted["reply_markup"]["inline_keyboard"]
                for b in row] == ["Allow once", "Deny"]
        model.script_text("ok")
        press(tg, tainted, "Deny", APPROVER)
        await until(lambda: tg.bot_messages(STRANGER), what="the stranger's reply")
        assert tool_results(model)["c3"].startswith("denied by telegram:1001")
    events = timeline_approvals(tmp_path / "state")
    assert [(e["event"], e.get("by")) for e in events][:2] == [
        ("requested", None), ("allowed", "telegram:1001")]
    assert events[0]["command"] == "echo once >> count.txt"


async def test_deny_timeout_and_always_allow_give_the_model_plain_results(tmp_path, model, tg):
    clock = FakeClock()
    key = "agent:main:cli:dm:local"
    command = "sh -c 'echo approved >> log.txt'"
    async with running_gateway(config(tmp_path, model, tg), clock=clock) as gw:
        ws = gw.config.workspace_for("main")

        async def turn(call_id: str, answer):
            model.script_tool_call("exec", {"command": command}, call_id=call_id)
            model.script_text(f"after {call_id}")
            task = asyncio.create_task(gw.local.send("go", session_key=key))
            n = len(tg.keyboard_messages) + 1
            prompt = await one_prompt(tg, n)
            await answer(prompt)
            result = await task
            assert result.text == f"after {call_id}"
            return prompt

        async def deny(prompt):
            press(tg, prompt, "Deny", APPROVER)

        async def wait_out(prompt):
            await clock.advance(61)

        async def always(prompt):
            press(tg, prompt, "Always allow", APPROVER)

        p1 = await turn("d1", deny)
        assert tool_results(model)["d1"] == "denied by telegram:1001: the command did not run"
        await turn("t1", wait_out)
        assert tool_results(model)["t1"] == \
            "timed out: nobody approved the command within 60s; it did not run"
        assert not (ws / "log.txt").exists()
        await turn("a1", always)
        assert (ws / "log.txt").read_text() == "approved\n"
        # stored: the same argv now runs without a request
        model.script_tool_call("exec", {"command": command}, call_id="a2")
        model.script_text("again")
        assert (await gw.local.send("go", session_key=key)).text == "again"
        assert (ws / "log.txt").read_text() == "approved\n" * 2
        assert len(tg.keyboard_messages) == 3
        assert "Denied by telegram:1001" in tg.messages[(APPROVER, p1["message_id"])]["text"]
    stored = json.loads((tmp_path / "state/approvals.json").read_text())
    [pattern] = stored["always"]["main"]
    assert pattern["by"] == "telegram:1001"
    assert pattern["pattern"].endswith("sh -c 'echo approved >> log.txt'")
    assert [r["status"] for r in sorted(stored["requests"], key=lambda r: r["requested_at"])
            ] == ["denied", "expired", "allowed"]
    events = [(e["event"], e.get("by")) for e in timeline_approvals(tmp_path / "state")]
    assert events == [("requested", None), ("denied", "telegram:1001"),
                      ("requested", None), ("expired", None),
                      ("requested", None), ("allowed", "telegram:1001")]


async def test_pending_requests_survive_a_restart_answerable_or_expiring_as_deny(
        tmp_path, model, tg):
    cfg = config(tmp_path, model, tg)
    path = write_config(tmp_path, cfg)
    keys = [f"agent:main:cli:dm:u{i}" for i in (1, 2, 3)]
    commands = [f"sh -c 'echo {i} >> out{i}.txt'" for i in (1, 2, 3)]
    async with running_gateway(cfg) as gw:
        tasks = []
        for key, command in zip(keys, commands, strict=True):
            model.script_tool_call("exec", {"command": command})
            tasks.append(asyncio.create_task(gw.local.send("go", session_key=key)))
            await one_prompt(tg, len(tasks))
    await asyncio.gather(*tasks, return_exceptions=True)  # cut off by the shutdown
    ids = [r["id"] for r in json.loads((tmp_path / "state/approvals.json").read_text())
           ["requests"]]
    rc, out, _ = await run_cli(path, "approvals", "list", "--json")  # gateway down: file
    assert rc == 0 and [r["status"] for r in json.loads(out)["pending"]] == ["pending"] * 3
    old_prompts = prompts(tg)
    clock = FakeClock(start=time.time())
    async with running_gateway(cfg, clock=clock) as gw:
        ws = gw.config.workspace_for("main")
        # 1: the approver's button from before the restart still answers it...
        qid = press(tg, old_prompts[0], "Allow once", APPROVER)
        await until(lambda: tg.callback_queries.get(qid), what="press answered")
        assert tg.callback_queries[qid]["text"] == "Allowed once."
        # ...but only the turn that asked may use it: another turn of the session that
        # runs the same command asks for itself (it may be tainted where that one was not)
        model.script_tool_call("exec", {"command": commands[0]}, call_id="r1")
        model.script_text("ran")
        again = asyncio.create_task(gw.local.send("again", session_key=keys[0]))
        fresh = await one_prompt(tg, 4)
        assert commands[0] in fresh["text"] and not (ws / "out1.txt").exists()
        press(tg, fresh, "Deny", APPROVER)
        assert (await again).text == "ran"
        assert not (ws / "out1.txt").exists()
        # 3: an operator answers from the CLI
        rc, out, err = await run_cli(path, "approvals", "allow", ids[2])
        assert rc == 0, err
        assert f"approval {ids[2]}: allowed" in out
        rc, _, err = await run_cli(path, "approvals", "deny", ids[2])
        assert rc == 1 and "already allowed by operator:cli" in err
        # 2: nobody answers: it expires as a deny, the approver's prompt says so and the
        # session is told in its next turn
        await clock.advance(61)
        await until(lambda: "Expired" in tg.messages[
            (APPROVER, old_prompts[1]["message_id"])]["text"], what="expiry shown")
        model.script_text("noted")
        await gw.local.send("what happened?", session_key=keys[1])
        last = json.dumps(model.requests[-1].json)
        assert f"approval request {ids[1]}" in last and "did not run" in last
        assert len(tg.keyboard_messages) == 4  # only the other turn asked again
    stored = {r["id"]: r for r in
              json.loads((tmp_path / "state/approvals.json").read_text())["requests"]}
    assert [(stored[i]["status"], stored[i]["decided_by"]) for i in ids] == [
        ("allowed", "telegram:1001"), ("expired", None), ("allowed", "operator:cli")]
    assert not stored[ids[0]]["consumed"] and not (ws / "out2.txt").exists()


async def test_a_kept_decision_is_used_only_by_the_turn_that_asked(tmp_path):
    """The records behind the resumed-turn reuse: same session, command and run id only."""
    from runtime.approvals.store import ApprovalRequest, ApprovalStore, FileApprovals
    records = FileApprovals(ApprovalStore(tmp_path))
    req = ApprovalRequest(id="r", agent_id="main", session_key="k", session_id="s",
                          tool="exec", command="touch G1", argv=["touch", "G1"], binary=None,
                          reason="miss", requested_at=0.0, expires_at=100.0,
                          approvers=["telegram:1"], run_id="run-a")
    await records.add(req)
    await records.settle("r", "allowed", "telegram:1", 1.0)
    assert await records.reusable("k", "touch G1", 2.0, "run-b") is None  # another turn
    assert await records.reusable("k", "touch G1", 2.0, "") is None
    assert (await records.reusable("k", "touch G1", 2.0, "run-a")).id == "r"


@pytest.mark.parametrize("command", [
    "ls *; id", "ls * && id", "ls * || id", "ls * | sh", "ls * > /etc/passwd", "ls $(id)",
    'ls "$(id)"', "ls `id`", "ls ${HOME}", "ls *\nid", "ls * &", "(ls *)", "ls 'unclosed",
    "FOO=1 ls *", ""])
def test_shell_metacharacters_never_match_an_allowlist_pattern(tmp_path, command):
    rules = ExecRules(security="allowlist", allowlist=["ls *"])
    v = exec_verdict(rules, command, [], path=os.environ["PATH"], cwd=str(tmp_path))
    assert v.action == "deny" and v.argv is None, v


@pytest.mark.parametrize(("command", "matches"), [
    ("ls", True), ("ls -la src", True), ("/usr/bin/ls -l", True), ("'ls' x", True),
    ("ls '$(id)'", True),  # single-quoted: a literal argument, no substitution
    ("ls \\; id", True),   # an escaped ';' is an argument to ls
    ("./ls -l", False),    # another binary of the same name
    ("lsblk", False), ("git status", True), ("git status --short", False),
    ("git log", True), ("git log --oneline -5", True), ("git push", False),
    # a word the shell expands matches only under a final lone *, never a pattern word
    ("ls *.txt", True), ("find . -name '*'", True), ("find . -name *", False),
    ("find . -name \\*", True), ('find . -name "*"', True), ("find . -name a*", False),
    ("find . -name ~", False), ("find . -name '~'", False), ("ls ~/x", True)])
def test_allowlist_matches_the_argv_and_the_resolved_binary(tmp_path, command, matches):
    (tmp_path / "ls").write_text("#!/bin/sh\n")
    (tmp_path / "ls").chmod(0o755)
    always = exact_pattern(["find", ".", "-name", "*"], path=os.environ["PATH"])
    rules = ExecRules(security="allowlist",
                      allowlist=["ls *", "git status", "git log *", "find . -name a*"])
    v = exec_verdict(rules, command, [always], path=os.environ["PATH"], cwd=str(tmp_path))
    assert (v.action == "run") is matches, v


def test_always_allow_stores_exactly_that_argv():
    path = os.environ["PATH"]
    argv = parse_command("rm -f 'a b.txt' x*")
    pattern = exact_pattern(argv, path=path)
    assert pattern_matches(pattern, argv, path=path)
    assert not pattern_matches(pattern, parse_command("rm -f 'a b.txt' xyz"), path=path)
    assert not pattern_matches(pattern, parse_command("rm -f 'a b.txt' x* more"), path=path)


async def test_the_wait_for_an_approver_does_not_count_against_the_turn_timeout(
        tmp_path, model, tg):
    """A 30 s turn timeout and a 60 s approval window: an approver who answers after 50 s
    still gets the command run and the model's answer; the turn's own time (before and
    after the wait) is still bounded."""
    clock = FakeClock()
    cfg = config(tmp_path, model, tg)
    cfg["agents"]["defaults"]["timeout"] = "30s"
    command = "sh -c 'echo late >> log.txt'"
    async with running_gateway(cfg, clock=clock) as gw:
        ws = gw.config.workspace_for("main")
        model.script_tool_call("exec", {"command": command}, call_id="w1")
        model.script_text("ran it")
        task = asyncio.create_task(gw.local.send("go", session_key="agent:main:cli:dm:w"))
        prompt = await one_prompt(tg)
        await clock.advance(50)  # past the turn's 30 s, inside the approval window
        press(tg, prompt, "Allow once", APPROVER)
        result = await task
        assert (result.status, result.text) == ("ok", "ran it")
        assert (ws / "log.txt").read_text() == "late\n"
        # and the deadline is back after the wait: a model that then hangs is cut at 30 s
        model.script_tool_call("exec", {"command": command}, call_id="w2")
        model.script_hang()
        task = asyncio.create_task(gw.local.send("again", session_key="agent:main:cli:dm:w"))
        prompt = await one_prompt(tg, 2)
        await clock.advance(20)
        press(tg, prompt, "Allow once", APPROVER)
        await until(lambda: (ws / "log.txt").read_text() == "late\n" * 2, what="run 2")
        await clock.advance(31)
        assert (await task).status == "timeout"


@pytest.mark.parametrize("path", [":/usr/bin:/bin", "/usr/bin:/bin:", "/usr/bin::/bin",
                                  ".:/usr/bin:/bin", "WS:/usr/bin:/bin"])
async def test_an_empty_or_relative_path_entry_never_runs_a_workspace_binary(
        tmp_path, monkeypatch, path):
    """The binary the allowlist checks is the one the shell runs: empty and relative
    PATH entries, and absolute ones inside the workspace (WS), are dropped from the
    command's PATH and from the look-up."""
    from runtime.tools.registry import ToolContext
    from runtime.tools.sources import EXEC_TOOL
    ws = tmp_path / "ws"
    ws.mkdir()
    path = path.replace("WS", str(ws))
    fake = ws / "date"
    fake.write_text("#!/bin/sh\necho PWNED-BY-WORKSPACE-DATE\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", path)
    monkeypatch.chdir(ws)  # the gateway's own cwd: what shutil.which tries for ""
    rules = ExecRules(security="allowlist", ask="off", allowlist=["/usr/bin/date *"])
    v = exec_verdict(rules, "date -u +%Y", [], path=path, cwd=str(ws))
    assert v.action == "run" and v.binary == os.path.realpath("/usr/bin/date")
    ctx = ToolContext(workspace=ws, session_key="agent:main:main", agent_id="main",
                      exec_timeout=5.0)
    out = await EXEC_TOOL.handler({"command": "date -u +%Y"}, ctx)
    assert "PWNED" not in out and str(time.gmtime().tm_year) in out
    from runtime.tools.exec import child_env
    assert child_env(str(ws))["PATH"] == "/usr/bin:/bin"


async def test_a_restart_while_a_chat_turn_waits_reruns_it_and_it_takes_up_its_request(
        tmp_path, model, tg):
    """The exec only waited for its approval when the gateway stopped: nothing ran, so
    the user is not told "some steps had already run"; the turn runs again (same run id)
    and takes up its own request, which the approver then allows."""
    cfg = config(tmp_path, model, tg)
    command = "echo ran >> out.txt"
    async with running_gateway(cfg):
        model.script_tool_call("exec", {"command": command}, call_id="w1")
        tg.inject_message("please run it", chat_id=USER, user_id=USER)
        await one_prompt(tg)
    [rid] = [r["id"] for r in json.loads((tmp_path / "state/approvals.json").read_text())
             ["requests"]]
    model.script_tool_call("exec", {"command": command}, call_id="w2")
    model.script_text("it ran")
    async with running_gateway(cfg) as gw:
        ws = gw.config.workspace_for("main")
        await until(lambda: any(m.get("text") == "it ran" for m in tg.bot_messages(USER))
                    or len(model.requests) >= 2, what="the turn runs again")
        qid = press(tg, prompts(tg)[0], "Allow once", APPROVER)
        await until(lambda: any(m.get("text") == "it ran" for m in tg.bot_messages(USER)),
                    what="the reply")
        assert tg.callback_queries[qid]["text"] == "Allowed once."
    assert (ws / "out.txt").read_text() == "ran\n"
    assert len(tg.keyboard_messages) == 1  # the resumed turn did not ask again
    texts = " ".join(m.get("text", "") for m in tg.bot_messages(USER))
    assert "had already run" not in texts
    stored = json.loads((tmp_path / "state/approvals.json").read_text())["requests"]
    assert [(r["id"], r["status"], r["consumed"]) for r in stored] == [(rid, "allowed", True)]


def test_a_command_the_shell_expands_cannot_be_always_allowed(tmp_path):
    rules = ExecRules(security="allowlist", ask="on-miss", allowlist=[])
    v = exec_verdict(rules, "rm -f *", [], path=os.environ["PATH"], cwd=str(tmp_path))
    assert v.action == "ask" and v.argv is None and "expands" in v.reason
    v = exec_verdict(rules, "rm -f '*'", [], path=os.environ["PATH"], cwd=str(tmp_path))
    assert v.action == "ask" and v.argv == ["rm", "-f", "*"]
