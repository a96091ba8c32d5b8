"""Inbound webhooks (gateway/hooks/, docs/webhooks.md) on the real gateway in-process with
the fake model: GitHub-style signed payloads (``X-Hub-Signature-256: sha256=…``) start a
turn whose reply comes back in the response or goes to a channel, a replayed delivery
runs once, refusals are 401/404/413/400 with no turn, the turn is tainted, and the secret
never reaches a log line."""

from __future__ import annotations

import json
import sys
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from gateway.config.load import ConfigError, parse_config
from gateway.hooks.verify import sign
from runtime import plugins
from tests.channel_harness import chat_requests, last_user_text
from tests.helpers import base_config, install_plugin, running_gateway
from tests.scheduler_harness import until

pytestmark = pytest.mark.timeout(30)
SECRET = "whsec-7f3a9c1e5b2d4680"
PUSH = {"ref": "refs/heads/main", "repository": {"full_name": "acme/tides"},
        "pusher": {"name": "alice"}, "head_commit": {"message": "Fix the low-tide table"}}
TEMPLATE = ("{{event}} to {{repository.full_name}} by {{pusher.name}}: "
            "{{head_commit.message}}")


OPS = '''
from channels.sdk import AccountConfig, ChannelPlugin
from tests.scheduler_harness import RecordingChannel

class Config(AccountConfig):
    enabled: bool = False

PLUGIN = ChannelPlugin(name="ops", config=Config,
                       create=lambda account, config, context: RecordingChannel("ops", account))
'''


@pytest.fixture
def ops_plugin(tmp_path, monkeypatch):
    """An installed channel plugin ``ops`` whose adapter records what it is sent."""
    root = tmp_path / "site"
    root.mkdir()
    install_plugin(root, "tidegate-ops", "ops", "ops_channel", OPS)
    monkeypatch.syspath_prepend(str(root))
    plugins.forget()
    yield
    plugins.forget()
    sys.modules.pop("ops_channel", None)


def config(tmp_path, model, **hooks: Any) -> dict:
    cfg = base_config(tmp_path / "state", model.base_url, tools={"taint": {"mode": "deny"}})
    cfg["hooks"] = hooks
    return cfg


def github(body: bytes, delivery: str, secret: str = SECRET, **extra: str) -> dict:
    return {"X-Hub-Signature-256": sign(secret, body), "X-GitHub-Delivery": delivery,
            "X-GitHub-Event": "push", "Content-Type": "application/json", **extra}


async def post(gw: Any, path: str, body: bytes, headers: dict) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{gw.port}{path}", data=body,
                             headers=headers) as r:
            text = await r.text()
            return r.status, json.loads(text) if text.startswith("{") else text


async def test_a_signed_github_push_runs_once_and_answers_in_the_response(tmp_path, model):
    hook = {"signature": "github", "secret": "${GH_HOOK_SECRET}", "wait": True,
            "message_template": TEMPLATE}
    cfg = config(tmp_path, model, github=hook)
    from gateway.config.load import parse_config
    loaded = parse_config(cfg, "test", env={"GH_HOOK_SECRET": SECRET})
    assert loaded.config.hooks["github"].secret == SECRET  # from the env, as secrets are
    cfg["hooks"]["github"]["secret"] = SECRET
    body = json.dumps(PUSH).encode()
    with capture_logs() as logs:
        async with running_gateway(cfg) as gw:
            status, answer = await post(gw, "/hooks/github", body, github(body, "d-1"))
            assert status == 200, answer
            expected = "push to acme/tides by alice: Fix the low-tide table"
            assert answer["reply"] == f"echo: {expected}"
            assert answer["session_key"] == "agent:main:hook:github"
            # GitHub redelivers (or someone replays the captured request): no second turn
            status, again = await post(gw, "/hooks/github", body, github(body, "d-1"))
            assert (status, again["duplicate"]) == (200, True)
            entry = gw.agents["main"].store.get("agent:main:hook:github")
            assert entry is not None
    [req] = chat_requests(model)
    assert last_user_text(req).endswith(expected)
    assert [r["delivery"] for r in logs if r["event"] == "hook_replayed"] == ["d-1"]
    assert SECRET not in json.dumps(logs, default=str)


async def test_refusals_run_no_turn_and_are_logged(tmp_path, model):
    cfg = config(tmp_path, model, github={"signature": "github", "secret": SECRET,
                                           "max_body": 8192})
    body = json.dumps(PUSH).encode()
    deep = b"[" * 3000 + b"]" * 3000  # deeper than the JSON parser recurses
    with capture_logs() as logs:
        async with running_gateway(cfg) as gw:
            cases = [
                ("/hooks/github", body, github(body, "d-2", secret="not-the-secret"), 401),
                ("/hooks/github", body, {"X-GitHub-Delivery": "d-3"}, 401),  # unsigned
                ("/hooks/gitlab", body, github(body, "d-4"), 404),
                ("/hooks/github", b"x" * 9000, github(b"x" * 9000, "d-5"), 413),
                ("/hooks/github", b"not json", github(b"not json", "d-6"), 400),
                ("/hooks/github", b'"a string"', github(b'"a string"', "d-7"), 400),
                ("/hooks/github", deep, github(deep, "d-8"), 400),
            ]
            got = [(await post(gw, path, data, headers))[0]
                   for path, data, headers, _ in cases]
            assert got == [want for *_, want in cases]
            # the refused deliveries were not remembered: a good one with the same id runs
            status, _ = await post(gw, "/hooks/github", body, github(body, "d-2"))
            assert status == 202
            await until(lambda: chat_requests(model), what="the accepted delivery's turn")
    assert len(chat_requests(model)) == 1
    refused = [(r["status"], r["reason"]) for r in logs if r["event"] == "hook_refused"]
    assert refused == [(401, "bad signature"), (401, "bad signature"), (404, "unknown hook"),
                       (413, "body larger than 8192 bytes"),
                       (400, "body is not a JSON object or array"),
                       (400, "body is not a JSON object or array"),
                       (400, "body is not a JSON object or array")]
    assert SECRET not in json.dumps(logs, default=str)


async def test_the_reply_goes_to_the_deliver_target_and_the_turn_is_tainted(
        tmp_path, model, ops_plugin):
    hook = {"signature": "hmac-sha256", "secret": SECRET, "deliver": "ops:room-7",
            "session": "main", "message_template": "Alert: {{alert.title}}"}
    body = json.dumps({"alert": {"title": "disk 91% full"}}).encode()
    headers = {"X-Signature-256": sign(SECRET, body), "X-Delivery-Id": "a-1"}
    model.script_tool_call("exec", {"command": "rm -rf /var/log/old"}, call_id="x1")
    model.script_text("Disk alert noted; I did not clean anything.")
    cfg = config(tmp_path, model, alerts=hook)
    cfg["channels"] = {"ops": {"enabled": True}}
    async with running_gateway(cfg) as gw:
        ops = gw.deliverer.find("ops")
        status, answer = await post(gw, "/hooks/alerts", body, headers)
        assert (status, answer["session_key"]) == (202, "agent:main:main")
        await until(lambda: ops.sent, what="the delivered reply")
        assert [(m.to, m.text) for m in ops.sent] == [
            ("room-7", "Disk alert noted; I did not clean anything.")]
    results = {m["tool_call_id"]: m["content"] for r in model.requests
               for m in (r.json or {}).get("messages", []) if m["role"] == "tool"}
    assert results["x1"].startswith("denied: the turn is tainted by webhook alerts")
    assert last_user_text(chat_requests(model)[0]).endswith("Alert: disk 91% full")


async def test_an_event_hook_queues_a_system_event(tmp_path, model):
    """The woken turn is tainted by the body, as a webhook's own turn is."""
    hook = {"signature": "none", "action": "event", "session": "main",
            "message_template": "Build {{build.id}} {{build.status}}"}
    model.script_tool_call("exec", {"command": "echo redeploy"}, call_id="x1")
    model.script_text("HEARTBEAT_OK")
    async with running_gateway(config(tmp_path, model, ci=hook)) as gw:
        body = json.dumps({"build": {"id": 812, "status": "failed"}}).encode()
        status, answer = await post(gw, "/hooks/ci", body, {"X-Delivery-Id": "b-812"})
        assert (status, answer["queued"]) == (202, "event")
        await until(lambda: chat_requests(model), what="the woken session's turn")
        status, again = await post(gw, "/hooks/ci", body, {"X-Delivery-Id": "b-812"})
        assert again["duplicate"] is True
        await until(lambda: len(chat_requests(model)) == 2, what="the exec's result")
    req = chat_requests(model)[0]
    system = json.dumps(req["messages"])
    assert "Build 812 failed" in system
    results = {m["tool_call_id"]: m["content"] for r in model.requests
               for m in (r.json or {}).get("messages", []) if m["role"] == "tool"}
    assert results["x1"].startswith(
        "denied: the turn is tainted by webhook ci (content from outside the gateway)")


def test_a_deliver_target_on_an_unknown_channel_is_a_config_error(tmp_path, ops_plugin):
    def problems(deliver: str) -> list[str]:
        cfg = base_config(tmp_path / "state", hooks={"deploy": {
            "signature": "none", "deliver": deliver}}, channels={"ops": {"enabled": True}})
        try:
            parse_config(cfg, "test", env={})
        except ConfigError as exc:
            return exc.problems
        return []

    assert problems("ops:room-7") == []
    assert problems("OPS:room-7") == []
    assert problems("opz:room-7") == [
        "hooks.deploy.deliver.channel: 'opz' in 'opz:room-7': unknown channel (did you mean "
        "'ops'?): installed channel plugins are discord, email, matrix, slack, telegram, "
        "whatsapp, ops"]
    assert problems("telegram:1001") == [
        "hooks.deploy.deliver: channel 'telegram' is not enabled (channels.telegram.enabled)"]


def test_a_deliver_target_on_a_plugin_that_failed_to_load_is_a_config_error(tmp_path,
                                                                          monkeypatch):
    """An import failure and a plugin built for another SDK major: the hook could never
    deliver, so config validation refuses it, naming the key and the failed plugin."""
    root = tmp_path / "site"
    root.mkdir()
    install_plugin(root, "tidegate-boom", "boom", "boom_channel", "import no_such_mod_x\n")
    install_plugin(root, "tidegate-later", "later", "later_channel",
                   OPS.replace('name="ops"', 'name="later", sdk_version="2.0"'))
    monkeypatch.syspath_prepend(str(root))
    plugins.forget()
    try:
        found = {}
        for target in ("boom:1", "later:1"):
            cfg = base_config(tmp_path / "state", hooks={"alerts": {
                "signature": "none", "deliver": target}})
            with pytest.raises(ConfigError) as exc:
                parse_config(cfg, "test", env={})
            found[target] = exc.value.problems
    finally:
        plugins.forget()
        sys.modules.pop("later_channel", None)
    assert found["boom:1"] == [
        "hooks.alerts.deliver: channel plugin 'boom' failed to load, nothing can be "
        "delivered to it: channel plugin 'boom' (tidegate-boom 1.2.3) failed to load: "
        "ModuleNotFoundError: No module named 'no_such_mod_x'"]
    [later] = found["later:1"]
    assert later.startswith("hooks.alerts.deliver: channel plugin 'later' failed to load, "
                            "nothing can be delivered to it: ") and "SDK 2.0" in later
