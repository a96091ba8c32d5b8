"""The 7-layer tool policy through the whole gateway against the fake model (issue 11
"How it is proven"): each layer narrows, a lower layer never re-adds, `tools explain`
for a Discord group vs a DM, unknown entries, refusal at execution, cache, plugin slot
and per-provider schemas."""

from __future__ import annotations

import json

import pytest
import yaml
from structlog.testing import capture_logs

from channels.base import InboundMessage
from gateway.cli.main import main as cli_main
from runtime.clock import FakeClock
from runtime.tools.policy import ToolScope
from runtime.tools.registry import Tool, object_schema
from runtime.tools.schema import tool_schema_for
from tests.fakes.fake_openai import FakeOpenAI
from tests.scheduler_harness import T0, RecordingChannel, config, gateway, until


@pytest.fixture
async def fake():
    async with FakeOpenAI() as server:
        yield server


def offered(request) -> list[str]:
    return [t["function"]["name"] for t in request.json.get("tools") or []]


def discord_msg(text: str, group: str | None = "G1", mid: str = "m1") -> InboundMessage:
    if group is None:
        return InboundMessage(channel="discord", text=text, sender_id="u1", peer_id="u1",
                              chat_type="dm", message_id=mid)
    return InboundMessage(channel="discord", text=text, sender_id="u1", peer_id="u1",
                          chat_type="group", group_id=group, mentions_bot=True,
                          message_id=mid)


async def discord_turn(gw, fake, text: str = "hi", group: str | None = "G1"):
    """A message from a Discord group (or DM) through intake; returns the model request."""
    n = len(fake.requests)
    await gw.intake.on_message(discord_msg(text, group))
    await until(lambda: len(fake.requests) > n and gw.discord.sent, what="the turn")
    return fake.requests[n]


async def with_discord(cfg, clock):
    ctx = gateway(cfg, clock)
    gw = await ctx.__aenter__()
    gw.discord = RecordingChannel("discord")
    gw.deliverer.register(gw.discord)
    return ctx, gw


LAYERS = [
    (1, {"tools": {"profile": "messaging"}}),
    (2, {"tools": {"by_provider": {"fake": {"profile": "minimal"}}}}),
    (3, {"tools": {"deny": ["exec"]}}),
    (4, {"tools": {"by_provider": {"fake": {"deny": ["group:runtime"]}}}}),
    (5, {"agents": {"defaults": {"tools": {"deny": ["exec"]}}}}),
    (6, {"agents": {"defaults": {"tools": {"by_provider": {"fake": {"allow": ["*", "!exec"]}}}}}}),
    (7, {"channels": {"discord": {"groups": {"G1": {"tools": {"deny": ["exec"]}}}}}}),
]


def merged(cfg: dict, extra: dict) -> dict:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            merged(cfg[k], v)
        else:
            cfg[k] = v
    return cfg


@pytest.mark.parametrize(("layer", "extra"), LAYERS, ids=[f"layer{n}" for n, _ in LAYERS])
async def test_each_layer_narrows(tmp_path, fake, layer, extra):
    cfg = merged(config(tmp_path, fake.base_url), json.loads(json.dumps(extra)))
    ctx, gw = await with_discord(cfg, FakeClock(T0))
    try:
        request = await discord_turn(gw, fake)
        tools = offered(request)
        assert "exec" not in tools
        assert "session_status" in tools  # narrowed, not emptied
        scope = ToolScope("main", "fake", channel="discord", chat_type="group", group_id="G1")
        why = gw.tool_policy.resolve(scope).refusal("exec")
        assert why is not None and why.layer == layer
    finally:
        await ctx.__aexit__(None, None, None)


async def test_a_lower_layer_cannot_re_add_what_a_higher_layer_removed(tmp_path, fake):
    cfg = merged(config(tmp_path, fake.base_url), {
        "tools": {"deny": ["exec"]},
        "agents": {"defaults": {"tools": {"allow": ["exec", "read", "session_status"]}}},
        "channels": {"discord": {"groups": {"G1": {"tools": {"allow": ["exec", "read"]}}}}}})
    ctx, gw = await with_discord(cfg, FakeClock(T0))
    try:
        assert offered(await discord_turn(gw, fake)) == ["read"]
        res = gw.tool_policy.resolve(ToolScope("main", "fake", channel="discord",
                                               chat_type="group", group_id="G1"))
        assert res.refusal("exec").layer == 3
        assert res.refusal("session_status").layer == 7
        assert res.refusal("write").layer == 5
    finally:
        await ctx.__aexit__(None, None, None)


async def test_disallowed_call_is_refused_at_execution_and_logged(tmp_path, fake):
    cfg = merged(config(tmp_path, fake.base_url), {"tools": {"deny": ["exec"]}})
    async with gateway(cfg, FakeClock(T0)) as gw:
        fake.script_tool_call("exec", {"command": "touch pwned"})
        fake.script_text("Could not run it.")
        with capture_logs() as logs:
            result = await gw.local.send("run it")
        assert result.text == "Could not run it."
        tool_msg = fake.requests[-1].json["messages"][-1]
        assert tool_msg["role"] == "tool" and "not allowed" in tool_msg["content"]
        assert "layer 3" in tool_msg["content"] and "deny: exec" in tool_msg["content"]
        assert not (gw.config.workspace_for("main") / "pwned").exists()
        [rec] = [r for r in logs if r["event"] == "tool_call_refused"]
        assert rec["session_key"] == "agent:main:cli:dm:local" and rec["tool"] == "exec"
        assert rec["log_level"] == "warning" and rec["layer"] == 3


async def test_unknown_entry_gives_one_diagnostic_not_a_crash(tmp_path, fake):
    cfg = merged(config(tmp_path, fake.base_url), {
        "tools": {"allow": ["read", "exex", "group:nope", "plugin:mcp:*"]},
        "agents": {"defaults": {"tools": {"deny": ["plugin:github"]}}}})
    with capture_logs() as logs:
        async with gateway(cfg, FakeClock(T0)) as gw:
            result = await gw.local.send("hello")
            assert result.status == "ok"
            assert gw.tool_diagnostics == [
                "tools.allow[1]: 'exex' matches no known tool or group",
                "tools.allow[2]: 'group:nope' matches no known tool or group",
                "agents.main.tools.deny[0]: 'plugin:github' matches no known tool or group"]
    warned = [r for r in logs if r["event"] == "tool_policy_unknown_entry"]
    assert len(warned) == 3


def write_cfg(tmp_path, cfg) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_tools_explain_discord_group_vs_dm(tmp_path, capsys):
    cfg = config(tmp_path, "http://127.0.0.1:9/v1")
    merged(cfg, {"tools": {"deny": ["cron"], "allow": ["*", "nonsense"]},
                 "channels": {"discord": {"groups": {"G1": {"tools": {
                     "allow": ["read", "group:memory", "react", "thread_create"]}}},
                     "dm": {"tools": {"deny": ["exec"]}}}}})
    path = write_cfg(tmp_path, cfg)
    assert cli_main(["--config", path, "tools", "explain", "--channel", "discord",
                     "--group", "G1", "--json"]) == 0
    group = json.loads(capsys.readouterr().out)
    assert group["tools"] == ["read", "memory_search", "memory_get", "memory_write", "react",
                              "thread_create"]
    removed = {r["tool"]: r for r in group["removed"]}
    assert removed["cron"]["layer"] == 3 and removed["cron"]["entry"] == "deny: cron"
    assert removed["exec"] == {"tool": "exec", "layer": 7, "layer_name": "group/channel",
                               "path": "channels.discord.groups.G1.tools",
                               "entry": "allow: not listed"}
    assert group["diagnostics"] == ["tools.allow[1]: 'nonsense' matches no known tool or group"]

    assert cli_main(["--config", path, "tools", "explain", "--channel", "discord"]) == 0
    dm = capsys.readouterr().out
    assert "exec: removed by layer 7 (group/channel) channels.discord.dm.tools: deny: exec" in dm
    assert "cron: removed by layer 3 (global) tools.allow/deny: deny: cron" in dm
    assert "thread_create" in dm and "write" in dm.split("tools (")[1].split("\n")[0]

    assert cli_main(["--config", path, "tools", "explain", "--channel", "slack"]) == 0
    slack = capsys.readouterr().out
    assert "thread_create: removed by layer 0 (source) channel tools: only in turns " \
           "from discord" in slack
    assert cli_main(["--config", path, "tools", "check"]) == 1
    assert "'nonsense' matches no known tool" in capsys.readouterr().out


async def test_final_set_is_cached_per_scope_until_reload(tmp_path, fake):
    from gateway.config.load import parse_config
    cfg = config(tmp_path, fake.base_url)
    async with gateway(cfg, FakeClock(T0)) as gw:
        await gw.local.send("one")
        await gw.local.send("two")
        await gw.local.send("three", to="someone-else")
        assert gw.tool_policy.computed == 1  # same (agent, provider, channel, group)
        assert "exec" in offered(fake.requests[-1])
        new = merged(json.loads(json.dumps(cfg)), {"tools": {"deny": ["exec"]}})
        await gw.reload(parse_config(new, "test", env={}))
        await gw.local.send("four")
        assert "exec" not in offered(fake.requests[-1])


async def test_plugin_tools_register_in_their_slot_with_openai_safe_schemas(tmp_path, fake):
    async def lookup(args, ctx):
        return f"issue {args['number']}"

    schema = {"type": "object", "$schema": "http://json-schema.org/draft-07/schema#",
              "properties": {"number": {"type": "integer", "minimum": 1},
                             "format": {"type": "string", "pattern": "^[a-z]+$",
                                        "default": "md"}},
              "required": ["number"]}
    cfg = merged(config(tmp_path, fake.base_url), {
        "agents": {"defaults": {"tools": {"deny": ["plugin:mcp:other"]}}}})
    async with gateway(cfg, FakeClock(T0)) as gw:
        gw.tools.register_plugin("mcp:github", [Tool("gh_issue", "Look up an issue", schema,
                                                     lookup)])
        gw.tools.register_plugin("mcp:other", [Tool("other_tool", "x", object_schema({}, []),
                                                    lookup)])
        fake.script_tool_call("gh_issue", {"number": 7})
        fake.script_text("done")
        await gw.local.send("look up 7")
        req = fake.requests[-2]
        names = offered(req)
        assert names[-1] == "gh_issue" and "other_tool" not in names  # plugins come last
        params = next(t["function"]["parameters"] for t in req.json["tools"]
                      if t["function"]["name"] == "gh_issue")
        assert params == {"type": "object", "required": ["number"], "properties": {
            "number": {"type": "integer"}, "format": {"type": "string"}}}
        assert fake.requests[-1].json["messages"][-1]["content"] == "issue 7"
        tool = gw.tools.get("gh_issue")
        assert (tool.source, tool.group, tool.side_effects) == \
            ("plugin:mcp:github", "plugin:mcp:github", True)
    assert tool_schema_for("anthropic", schema) is schema  # Anthropic keeps it whole


def test_every_tool_has_source_group_and_side_effects():
    from runtime.tools.sources import builtin_registry
    tools = {t.name: t for t in builtin_registry().assembled()}
    assert list(tools) == [
        "read", "write", "edit", "apply_patch", "exec", "process", "message", "memory_search",
        "memory_get", "memory_write", "cron", "sessions_list", "sessions_history",
        "sessions_send", "sessions_spawn", "session_status", "react", "pin", "thread_create"]
    side = {n for n, t in tools.items() if t.side_effects}
    assert side == {"write", "edit", "apply_patch", "exec", "process", "message",
                    "memory_write", "cron", "sessions_send", "sessions_spawn", "react", "pin",
                    "thread_create"}
    assert {t.source for t in tools.values()} == {
        "core", "runtime", "messaging", "memory", "automation", "sessions", "channel"}


def test_tools_explain_validates_provider_channel_and_account(tmp_path, capsys):
    cfg = config(tmp_path, "http://127.0.0.1:9/v1")
    merged(cfg, {"channels": {"slack": {"enabled": True, "accounts": {
        "work": {"bot_token": "xoxb-1", "app_token": "xapp-1"}}}}})
    path = write_cfg(tmp_path, cfg)
    provider = next(iter(cfg["models"]["providers"]))

    def explain(*args: str) -> tuple[int, str, str]:
        code = cli_main(["--config", path, "tools", "explain", *args])
        out, err = capsys.readouterr()
        return code, out, err

    code, _, err = explain("--provider", provider + "x")
    assert code == 2 and f"unknown provider '{provider}x'" in err
    assert f"did you mean '{provider}'?" in err
    code, _, err = explain("--channel", "telegarm")
    assert code == 2 and "unknown channel 'telegarm'" in err and "'telegram'" in err
    code, _, err = explain("--channel", "slack", "--account", "home")
    assert code == 2 and "unknown slack account 'home' (known: work)" in err
    assert explain("--channel", "slack", "--account", "work")[0] == 0
    code, out, err = explain("--channel", "discord", "--account", "ops")  # disabled
    assert code == 0 and "tools (" in out
    assert "warning: channels.discord is not enabled: account 'ops' is not checked" in err
    code, _, err = explain("--account", "ops")
    assert code == 2 and "--account needs --channel" in err
