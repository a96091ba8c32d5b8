"""Tainted turns on replicas (docs/exec.md "Tainted turns"): what tainted a turn is in
its work row before the turn goes on, and the replica that re-runs a dead replica's row
starts the turn tainted (its context still holds the untrusted page), so the allowlisted
exec asks. The real gateway in-process on a real PostgreSQL, the real TelegramChannel
against the fake Bot API, the fake model, a local page."""

from __future__ import annotations

import json

import pytest

from tests.channel_harness import until
from tests.cluster_harness import pg_query
from tests.helpers import base_config, running_gateway
from tests.test_exec_approvals import APPROVER, USER, one_prompt, tool_results
from tests.test_exec_tainted_requests import page  # noqa: F401 - a fixture

pytestmark = [pytest.mark.timeout(40),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

TAINT = "web_fetch of https://example.org/install"


async def test_taint_is_in_the_work_row_and_a_taken_over_rerun_is_tainted(
        tmp_path, model, tg, pg_dsn, page):  # noqa: F811
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
    cfg = base_config(tmp_path / "state", model.base_url, channels={"telegram": section},
                      storage={"backend": "postgres", "dsn": pg_dsn},
                      cluster={"lease_ttl": "1s", "replica_id": "r1"},
                      tools={"web": {"fetch": {"allow_private": True}},
                             "taint": {"owners": [f"telegram:{USER}", "telegram:7"]}})
    cfg["agents"]["defaults"]["tools"] = {"exec": {
        "security": "allowlist", "ask": "on-miss", "allowlist": ["echo *"],
        "approvers": [f"telegram:{APPROVER}"], "approval_timeout": "60s"}}
    async with running_gateway(cfg) as gw:
        model.script_tool_call("web_fetch", {"url": page}, call_id="f1")
        model.script_tool_call("exec", {"command": "echo one"}, call_id="e1")
        model.script_text("first done")
        tg.inject_message("install it", chat_id=USER, user_id=USER)
        await one_prompt(tg)
        assert await pg_query(pg_dsn, "SELECT taint FROM cluster_work") == [
            ([f"web_fetch of {page}"],)]
        [rid] = gw.approvals.waiting()
        await gw.approvals.decide(rid, "deny", "operator:test")
        await until(lambda: "e1" in tool_results(model), what="the first turn's exec")
        # a replica that died an hour ago in the middle of a tainted turn
        await pg_query(pg_dsn, "INSERT INTO cluster_replicas (id, host, pid, heartbeat_at) "
                               "VALUES ('dead', 'h', 2, now() - interval '1 hour')")
        work = json.dumps({"agent_id": "main", "text": "hello", "channel": "telegram",
                           "account_id": "default", "chat_type": "dm", "sender_id": "7",
                           "message_id": "41", "received_at": 0})
        model.script_tool_call("exec", {"command": "echo two"}, call_id="e2")
        model.script_text("second done")
        await pg_query(pg_dsn, "INSERT INTO cluster_work (session_key, work, target, state, "
                               "started, attempts, taint) VALUES ($1, $2, 'dead', "
                               "'running', true, 1, $3)", "agent:main:telegram:dm:7", work,
                       [TAINT])
        await until(lambda: "e2" in tool_results(model) or gw.approvals.waiting(),
                    timeout=20, what="the re-run's exec")
        assert "e2" not in tool_results(model), tool_results(model)["e2"]
        [rid] = gw.approvals.waiting()
        req = await gw.approvals.records.get(rid)
        assert req.reason == f"the turn is tainted by {TAINT}" and req.tainted
        await gw.approvals.decide(rid, "deny", "operator:test")
        await until(lambda: "e2" in tool_results(model), what="the re-run's result")
    assert tool_results(model)["e2"].startswith("denied by operator:test")
