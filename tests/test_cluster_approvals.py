"""Exec approvals on replicas (docs/exec.md "On replicas"): two gateway replicas
in-process on a real PostgreSQL, the real TelegramChannel (python-telegram-bot) against
the fake Bot API, the fake model. Replica A runs the Telegram account; the session's
lane, and so the paused turn, runs on replica B. A press on A's Telegram, or
``tidegate approvals allow`` against A, resumes the turn on B exactly once; A lists B's
requests; a restart of B keeps its request answerable, or expires it as a deny with a
notice."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.config.load import parse_config
from gateway.service.daemon import Gateway
from runtime.clock import FakeClock
from runtime.turn import ABORTED
from tests import cluster_harness
from tests.channel_harness import run_cli, until, write_config
from tests.cluster_harness import pause, pg_query
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config
from tests.test_exec_approvals import APPROVER, STRANGER, one_prompt, press, prompts

replica_dbs = cluster_harness.replica_dbs  # fixture

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]


def config(tmp: Path, name: str, dsn: str, model: Any, tg: FakeTelegram) -> dict:
    telegram = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
    cfg = base_config(tmp / name / "state", model.base_url,
                      channels={"telegram": telegram},
                      storage={"backend": "postgres", "dsn": dsn},
                      cluster={"lease_ttl": "3s", "replica_id": name})
    cfg["gateway"]["shutdown_grace"] = "0.5s"
    cfg["cron"] = {"enabled": False}
    cfg["agents"]["defaults"]["tools"] = {"exec": {
        "security": "allowlist", "ask": "on-miss", "allowlist": ["echo *"],
        "approvers": [f"telegram:{APPROVER}"], "approval_timeout": "60s"}}
    return cfg


async def start(cfg: dict, clock: FakeClock | None = None) -> Gateway:
    gw = Gateway(parse_config(cfg, "test", env={}), **({"clock": clock} if clock else {}))
    await gw.start()
    return gw


async def stop(gw: Gateway, clock: FakeClock) -> None:
    """Stop ``gw``; the shutdown grace of a turn still running passes on the FakeClock."""
    task = asyncio.create_task(gw.stop())
    while not task.done():
        await clock.advance(1)
        await asyncio.sleep(0.05)
    await task


def respond(model: Any, body: dict, commands: dict[str, str]) -> Any:
    """The model once nothing is scripted: "job N" calls exec with its command; a tool
    result is answered with text, but for a call a stop aborted: a turn run again after a
    restart finds its user message and that call in the transcript (its message is not
    written twice), and makes the call again while its job still calls exec."""
    last = body["messages"][-1]
    if last["role"] == "tool" and last["content"] != ABORTED:
        return "done: " + str(last["content"])[:80]
    text = model.last_user_text(body)
    for job, command in commands.items():
        if job in text:
            return {"type": "tool_calls", "text": "",
                    "calls": [{"name": "exec", "arguments": {"command": command}}]}
    return "ok"


async def timeline_approvals(dsn: str) -> list[dict]:
    """The exec_approval SYSTEM_EVENTs of every timeline in the database, in order."""
    rows = await pg_query(dsn, "SELECT content FROM timeline_events WHERE event_type = "
                          "'SYSTEM_EVENT' ORDER BY session_id, seq")
    return [c for c in (json.loads(r[0]) for r in rows) if c.get("kind") == "exec_approval"]


def labels(prompt: dict) -> list[str]:
    return [b["text"] for row in prompt["reply_markup"]["inline_keyboard"] for b in row]


async def answered(tg: FakeTelegram, qid: str) -> str:
    await until(lambda: tg.callback_queries.get(qid), what="the press answered")
    return tg.callback_queries[qid]["text"]


async def test_replicas_decide_anywhere_resume_on_the_lane_replica_once(
        tmp_path, pg_dsn, model, tg):
    clock = FakeClock(start=time.time())  # A and B after its restart: expiry is driven
    cfg_a, cfg_b = (config(tmp_path, n, pg_dsn, model, tg) for n in ("a", "b"))
    (tmp_path / "a").mkdir()
    path_a = write_config(tmp_path / "a", cfg_a)
    a: Gateway | None = await start(cfg_a, clock)
    b: Gateway | None = None
    try:
        await until(lambda: a.cluster.accounts.running, what="A runs the Telegram account")
        b = await start(cfg_b)  # the real clock: its stop waits out the shutdown grace
        assert not b.cluster.accounts.running  # the account stays on A
        ws_b = b.config.workspace_for("main")
        key = "agent:main:cli:dm:ops"

        # 1. a miss on B: A's bot sends the approver the buttons; A lists B's request
        model.script_tool_call("exec", {"command": "sh -c 'echo once >> n.txt'"},
                               call_id="c1")
        model.script_text("ran it")
        if True:
            turn = asyncio.create_task(b.local.send("go", session_key=key))
            prompt = copy.deepcopy(await one_prompt(tg))  # as sent, with its buttons
            assert labels(prompt) == ["Allow once", "Always allow", "Deny"]
            assert "sh -c 'echo once >> n.txt'" in prompt["text"]
            rc, out, err = await run_cli(path_a, "approvals", "list", "--json")
            assert rc == 0, err
            [pending] = json.loads(out)["pending"]
            assert (pending["session_key"], pending["replica"]) == (key, "b")
            # a stranger's press on A is refused, answered only to them
            assert await answered(tg, press(tg, prompt, "Allow once", STRANGER)) == \
                "Only an approver can answer this request."
            assert not turn.done() and not (ws_b / "n.txt").exists()
            # the approver's press on A runs the command on B, once
            assert await answered(tg, press(tg, prompt, "Allow once", APPROVER)) == \
                "Allowed once."
            result = await asyncio.wait_for(turn, 15)
        assert result.text == "ran it"
        assert (ws_b / "n.txt").read_text() == "once\n"
        await until(lambda: tg.keyboard(APPROVER, prompt["message_id"]) == [],
                    what="the buttons replaced")
        assert "Allowed once by telegram:1001" in \
            tg.messages[(APPROVER, prompt["message_id"])]["text"]

        # 2. the CLI against A decides B's next request ("always": stored cluster-wide)
        model.script_tool_call("exec", {"command": "touch made.txt"}, call_id="c2")
        model.script_text("made")
        turn = asyncio.create_task(b.local.send("make", session_key=key))
        await one_prompt(tg, 2)
        [rid] = [r["id"] for r in (await a.approvals.records.listing())["pending"]]
        rc, out, err = await run_cli(path_a, "approvals", "allow", rid, "--always")
        assert rc == 0 and f"approval {rid}: allowed (always)" in out, err
        assert (await asyncio.wait_for(turn, 15)).text == "made"
        assert (ws_b / "made.txt").exists()
        rc, _, err = await run_cli(path_a, "approvals", "deny", rid)
        assert rc == 1 and "already allowed by operator:cli" in err
        # both decisions are in the session's timeline, recorded once, by B
        events = [(e["event"], e.get("by")) for e in await timeline_approvals(pg_dsn)]
        assert events == [("requested", None), ("allowed", "telegram:1001"),
                          ("requested", None), ("allowed", "operator:cli")]
        # a NOTIFY and the tick's look can both bring a decision, the second after the
        # turn stopped waiting: it is not recorded again
        await b.approvals.notified(rid)
        await b.timeline_hooks.flush()
        assert len(await timeline_approvals(pg_dsn)) == 4
        assert await b.approvals.records.patterns("main") == [
            (await a.approvals.records.listing())["always"]["main"][0]["pattern"]]

        # 3. B restarts while two turns wait. Their journaled turns run again (on B, or
        # on A, which may take them over meanwhile), each seeing its aborted exec call:
        # the one that makes the same call again takes up its request, which A's Telegram
        # answers; the other no longer asks, and its request expires as a deny with a
        # notice to the session
        commands = {"job 1": "sh -c 'echo 1 >> r1.txt'", "job 2": "sh -c 'echo 2 >> r2.txt'"}
        model.responder = lambda body: respond(model, body, commands)
        waiting = []
        for n, k in enumerate(["agent:main:cli:dm:u1", "agent:main:cli:dm:u2"], 1):
            waiting.append(asyncio.create_task(b.local.send(f"job {n}", session_key=k)))
            await one_prompt(tg, 2 + n)
        old = copy.deepcopy(prompts(tg)[2:4])
        await b.stop()
        await asyncio.gather(*waiting, return_exceptions=True)  # cut off by the stop
        job2 = commands.pop("job 2")  # run again, job 2 no longer calls exec
        b = await start(cfg_b, clock)
        workspaces = [a.config.workspace_for("main"), ws_b]
        await until(lambda: len(a.approvals.waiting() + b.approvals.waiting()) == 1,
                    timeout=20, what="the resumed turn waiting for its request")
        assert await answered(tg, press(tg, old[0], "Allow once", APPROVER)) == \
            "Allowed once."
        await until(lambda: any((w / "r1.txt").exists() for w in workspaces),
                    what="the approved command run")
        # the re-run sent its user message once, its aborted call after it
        assert all([m.get("content") for m in r.json["messages"]].count(f"job {n}") <= 1
                   for r in model.requests for n in (1, 2))
        await clock.advance(time.time() - clock.time() + 61)  # B made it on the wall clock
        await until(lambda: "Expired" in tg.messages[
            (APPROVER, old[1]["message_id"])]["text"], what="the expiry shown on A's bot")
        model.script_text("noted")
        assert (await b.local.send("what happened?", session_key="agent:main:cli:dm:u2")
                ).text == "noted"
        told = json.dumps(model.requests[-1].json)
        assert "expired unanswered" in told and "did not run" in told
        assert [(w / "r1.txt").read_text() for w in workspaces
                if (w / "r1.txt").exists()] == ["1\n"]  # once, on one replica
        assert not any((w / "r2.txt").exists() for w in workspaces)
        assert len(prompts(tg)) == 4  # the resumed turn asked nobody twice
        statuses = {r["command"]: (r["status"], r["decided_by"], r["consumed"])
                    for r in (await b.approvals.records.listing())["recent"]}
        assert statuses[commands["job 1"]] == ("allowed", "telegram:1001", True)
        assert statuses[job2] == ("expired", None, False)
        # with every replica stopped, the CLI reads the shared records itself
        for gw in (b, a):
            await stop(gw, clock)
        a = b = None
        rc, out, err = await run_cli(path_a, "approvals", "list", "--json")
        assert rc == 0, err
        listed = json.loads(out)
        assert listed["pending"] == [] and len(listed["recent"]) == 4
        assert listed["always"]["main"][0]["by"] == "operator:cli"
    finally:
        for gw in (b, a):
            if gw is not None:
                await stop(gw, clock)


async def test_answers_at_once_on_two_replicas_count_once_and_a_dead_replicas_requests_move(
        replica_dbs, pg_dsn):
    """The decision is a compare-and-set in PostgreSQL: twenty answers at once from two
    replicas, one wins, one NOTIFY; a dead replica's pending request is taken over by one
    live replica, and the dead one can no longer expire it."""
    import asyncpg

    from gateway.cluster.approvals import CHANNEL, PgApprovals
    from runtime.approvals.store import ApprovalRequest
    r1, r2 = (PgApprovals(replica_dbs[r], r, 3.0) for r in ("r1", "r2"))
    now = time.time()

    def request(rid: str) -> ApprovalRequest:
        return ApprovalRequest(id=rid, agent_id="main", session_key="agent:main:x",
                               session_id="s", tool="exec", command="ls", argv=["ls"],
                               binary="/usr/bin/ls", reason="not in the allowlist",
                               requested_at=now, expires_at=now + 60,
                               approvers=["telegram:1001"])
    heard: list[str] = []
    listener = await asyncpg.connect(pg_dsn)
    await listener.add_listener(CHANNEL, lambda *a: heard.append(a[-1]))
    try:
        await r1.add(request("race"))
        answers = await asyncio.gather(*[
            rec.settle("race", "denied" if i % 2 else "allowed", f"telegram:{i}", now)
            for i, rec in enumerate([r1, r2] * 10)])
        [won] = [a for a in answers if a is not None]
        stored = await r2.get("race")
        assert (stored.status, stored.decided_by) == (won.status, won.decided_by)
        await until(lambda: heard, what="the notification")
        await asyncio.sleep(0.2)  # a second one would have arrived by now
        assert heard == ["race"]

        await r1.add(request("orphan"))
        await pause(replica_dbs["r2"], "r1")  # r1 stops beating: dead to the others
        assert [r.id for r in await r2.adopt()] == ["orphan"]
        assert await r2.adopt() == []
        assert await r1.settle("orphan", "expired", None, now, mine_only=True) is None
        assert (await r2.settle("orphan", "expired", None, now, mine_only=True)).status == \
            "expired"
    finally:
        await listener.close()
