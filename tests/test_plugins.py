"""Plugin discovery and its failures (runtime/plugins.py, channels/registry.py): real
entry points of distributions written into a temp dir on ``sys.path`` (importlib.metadata
finds them as it finds installed ones)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import sys

import pytest
from structlog.testing import capture_logs

from channels import registry
from gateway.cli import main as cli_main
from gateway.config.load import ConfigError, parse_config
from gateway.service.daemon import Gateway
from runtime import plugins
from runtime.clock import FakeClock
from tests.channel_harness import until
from tests.helpers import base_config, running_gateway
from tests.helpers import install_plugin as install

GOOD = '''
from channels.sdk import AccountConfig, ChannelPlugin

class Config(AccountConfig):
    enabled: bool = False
    room: str = "lobby"

PLUGIN = ChannelPlugin(name="{name}", config=Config, create=lambda a, c, ctx: None,
                       sdk_version="{sdk}")
'''


@pytest.fixture
def site_dir(tmp_path, monkeypatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    plugins.forget()
    plugins._logged.clear()
    yield root
    plugins.forget()
    plugins._logged.clear()
    for mod in ("broken_channel", "future_channel", "room_channel", "tides_tool",
                "canned_provider", "pond_channel", "stall_channel", "fail_channel",
                "quick_channel", "bare_channel", "bent_channel", "kelp_channel",
                "leaky_channel", "mute_channel"):
        sys.modules.pop(mod, None)


def problems(data: dict) -> list[str]:
    try:
        parse_config(data, "test", env={})
    except ConfigError as exc:
        return exc.problems
    raise AssertionError("config was accepted")


async def test_a_plugin_that_fails_to_import_disables_only_itself(site_dir, tmp_path):
    install(site_dir, "tidegate-broken", "broken", "broken_channel",
            "import not_a_module_anywhere\n")
    install(site_dir, "tidegate-room", "room", "room_channel",
            GOOD.format(name="room", sdk="1.4"))
    with capture_logs() as logs:
        assert list(registry.channel_plugins()) == ["discord", "email", "matrix", "slack", "telegram", "whatsapp", "room"]
        registry.channel_plugins()  # asked again: logged once only
        cfg = base_config(tmp_path / "state", channels={"broken": {"enabled": True},
                                                        "room": {"room": "hall"}})
        async with running_gateway(cfg) as gw:
            assert gw.config.channels.room.room == "hall"
            assert gw.config.channels.platform("broken") is None
            found = [p for p in gw.status()["problems"] if "broken" in p]
    [failed] = [r for r in logs if r["event"] == "plugin_load_failed"]
    assert failed["plugin"] == "broken" and failed["package"] == "tidegate-broken"
    # SDK 1.4 on a 1.1 host loads, with a warning: it may use what 1.1 lacks
    [newer] = [r for r in logs if r["event"] == "plugin_sdk_newer"]
    assert (newer["plugin"], newer["targets"], newer["provides"]) == ("room", "1.4", "1.1")
    assert "ModuleNotFoundError: No module named 'not_a_module_anywhere'" in failed["traceback"]
    assert found == [("channel plugin 'broken' (tidegate-broken 1.2.3) failed to load: "
                     "ModuleNotFoundError: No module named 'not_a_module_anywhere'")]


def test_a_plugin_for_another_major_sdk_is_a_start_error_naming_it(site_dir):
    install(site_dir, "tidegate-future", "future", "future_channel",
            GOOD.format(name="future", sdk="2.0"))
    assert problems({"channels": {"future": {"enabled": True}}}) == [
        ("channels.future: plugin 'future' (tidegate-future) targets SDK 2.0; this tidegate "
        "provides SDK 1.1 (install a version of the plugin built for 1.x)")]
    assert "future" not in registry.channel_names()


def test_a_plugin_whose_sdk_version_is_no_version_is_told_so(site_dir):
    install(site_dir, "tidegate-fruit", "fruit", "fruit_channel",
            GOOD.format(name="fruit", sdk="banana"))
    assert problems({"channels": {"fruit": {"enabled": True}}}) == [
        ("channels.fruit: plugin 'fruit' (tidegate-fruit) declares sdk_version 'banana', "
         "which is not a version (major.minor); this tidegate provides SDK 1.1")]


def test_a_plugin_config_is_validated_by_its_model_and_errors_name_the_key(site_dir):
    install(site_dir, "tidegate-room", "room", "room_channel",
            GOOD.format(name="room", sdk="1.0"))
    assert problems({"channels": {"room": {"rooom": "x", "dm_policy": "sometimes"}}}) == [
        ("channels.room.dm_policy: Input should be 'pairing', 'allowlist', 'open' or "
        "'disabled' (got 'sometimes')"),
        "channels.room.rooom: unknown key (did you mean 'room'?)"]
    assert problems({"channels": {"rom": {}}}) == [
        ("channels.rom: unknown channel (did you mean 'room'?): installed channel plugins "
        "are discord, email, matrix, slack, telegram, whatsapp, room; local channels webchat, openai_api")]


def run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(list(args))
    return code, out.getvalue()


def test_plugins_list_and_doctor(site_dir):
    install(site_dir, "tidegate-broken", "broken", "broken_channel",
            "raise RuntimeError('cannot reach the license server')\n")
    install(site_dir, "tidegate-room", "room", "room_channel",
            GOOD.format(name="room", sdk="1.0"))
    code, text = run_cli("plugins", "list")
    assert code == 0
    rows = [line.split() for line in text.splitlines()]
    assert ["telegram", "channel", "0.1.0", "builtin", "tidegate"] in rows
    assert ["room", "channel", "1.2.3", "package", "tidegate-room"] in rows
    assert ["broken", "channel", "1.2.3", "package", "tidegate-broken", "[failed]"] in rows
    code, text = run_cli("plugins", "doctor")
    assert code == 1
    assert "ok    channel room (tidegate-room 1.2.3, SDK 1.0)" in text
    assert ("FAIL  channel broken (tidegate-broken 1.2.3): channel plugin 'broken' "
            "(tidegate-broken 1.2.3) failed to load: RuntimeError: cannot reach the "
            "license server") in text
    assert "broken_channel.py" in text  # the traceback, for whoever fixes it


def test_cli_commands_tell_of_a_broken_plugin_in_one_line(site_dir, tmp_path, capsys):
    """A CLI command prints one line for a plugin that fails to load (no traceback), and
    the unknown-channel hint lists it apart, as failed."""
    install(site_dir, "tidegate-broken", "broken", "broken_channel",
            "raise RuntimeError('cannot reach the license server')\n")
    install(site_dir, "tidegate-room", "room", "room_channel",
            GOOD.format(name="room", sdk="1.0"))
    path = tmp_path / "config.yaml"
    path.write_text(f"gateway: {{state_dir: {tmp_path / 'state'}}}\nchannels: {{rooom: {{}}}}\n")
    code = cli_main(["config", "validate", "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert [line for line in err.splitlines() if "broken" in line and "failed to load" in
            line and "unknown channel" not in line] == [
        "tidegate: channel plugin 'broken' (tidegate-broken 1.2.3) failed to load: "
        "RuntimeError: cannot reach the license server (the other plugins work; "
        "`tidegate plugins doctor` shows why)"]
    assert "Traceback" not in err
    assert ("channels.rooom: unknown channel (did you mean 'room'?): installed channel "
            "plugins are discord, email, matrix, slack, telegram, whatsapp, room; failed to "
            "load: broken (tidegate plugins doctor); local channels webchat, openai_api") in err


TOOL = '''
from runtime.plugins import SDK_VERSION
from runtime.tools.plugins import ToolPlugin
from runtime.tools.registry import Tool, object_schema

async def tide_level(args, ctx):
    return f"high water at 06:10 in {args['harbour']}"

PLUGIN = ToolPlugin(name="tides", tools=[Tool(
    "tide_level", "The next high water of a harbour.",
    object_schema({"harbour": {"type": "string"}}, ["harbour"]), tide_level)])
'''


async def test_a_tool_plugin_adds_tools_the_model_can_call(site_dir, tmp_path, model):
    install(site_dir, "tidegate-tides", "tides", "tides_tool", TOOL)
    (next(site_dir.glob("tidegate_tides-*.dist-info")) / "entry_points.txt").write_text(
        "[tidegate.tools]\ntides = tides_tool:PLUGIN\n")
    model.script_tool_call("tide_level", {"harbour": "Brest"}, call_id="t1")
    model.script_text("Six ten.")
    async with running_gateway(base_config(tmp_path / "state", model.base_url)) as gw:
        assert (await gw.local.send("when is high water in Brest?")).text == "Six ten."
    results = [m["content"] for r in model.requests for m in (r.json or {}).get(
        "messages", []) if m.get("role") == "tool"]
    assert results == ["high water at 06:10 in Brest"]
    offered = [t["function"]["name"] for t in model.requests[0].json["tools"]]
    assert "tide_level" in offered
    code, text = run_cli("plugins", "list")
    assert code == 0
    assert ["tides", "tool", "1.2.3", "package", "tidegate-tides"] in [
        line.split() for line in text.splitlines()]


PROVIDER = '''
from runtime.providers.base import ModelResponse
from runtime.providers.plugins import ProviderPlugin

class Canned:
    api = "canned"

    def __init__(self, name, base_url, api_key, headers, *, clock=None):
        self.name, self.base_url = name, base_url

    async def complete(self, request, on_delta=None):
        said = [m.content for m in request.messages if m.role == "user"][-1]
        return ModelResponse(text=f"canned {request.model} at {self.base_url}: "
                                  f"{said.splitlines()[-1]}")

PLUGIN = ProviderPlugin(name="canned", create=Canned)
'''


async def test_a_provider_plugin_serves_models_providers_api(site_dir, tmp_path):
    install(site_dir, "tidegate-canned", "canned", "canned_provider", PROVIDER)
    (next(site_dir.glob("tidegate_canned-*.dist-info")) / "entry_points.txt").write_text(
        "[tidegate.providers]\ncanned = canned_provider:PLUGIN\n")
    cfg = base_config(tmp_path / "state", models={"providers": {"local": {
        "api": "canned", "base_url": "http://127.0.0.1:9"}}},
        agents={"defaults": {"model": "local/tiny"}})
    async with running_gateway(cfg) as gw:
        reply = (await gw.local.send("ping")).text
    assert reply == "canned tiny at http://127.0.0.1:9: ping"
    assert [p for p in problems({"models": {"providers": {"x": {"api": "cannned"}}}})
            if p.startswith("models.providers.x.api")] == [
        "models.providers.x.api: Input should be 'openai' or 'anthropic' (got 'cannned')"]


POND = '''
from channels.sdk import (AccountConfig, Capabilities, ChannelAdapter, ChannelPlugin,
                          sent)

class Config(AccountConfig):
    enabled: bool = False

ADAPTERS = []

class Pond(ChannelAdapter):  # capabilities only on the plugin, as the SDK docs say
    name = "pond"

    async def open(self):
        self.sent, self.reactions = [], []
        ADAPTERS.append(self)
        self.set_state("connected")

    async def send(self, message):
        self.sent += [(message.to, part) for part in self.parts(message.text)]
        return sent(*[str(i) for i in range(len(self.sent))])

    async def react(self, to, thread_id, message_id, emoji, *, remove=False):
        self.reactions.append((to, message_id, emoji))

PLUGIN = ChannelPlugin(name="pond", config=Config,
                       capabilities=Capabilities(reactions=True, text_limit=60),
                       create=lambda account, config, context: Pond(account, config, context))
'''


async def test_an_sdk_adapter_in_process_reacts_and_splits(site_dir, tmp_path, model):
    """ChannelAdapter's deliver/parts/act: a message in, the react tool (offered because
    the plugin declares reactions), a reply split under its text_limit — the
    capabilities declared on the ChannelPlugin only, which the adapter must use."""
    install(site_dir, "tidegate-pond", "pond", "pond_channel", POND)
    from channels.sdk import InboundMessage
    model.script_tool_call("react", {"emoji": "🐸"}, call_id="r1")
    model.script_text("Ribbit. " * 12)
    cfg = base_config(tmp_path / "state", model.base_url, channels={"pond": {
        "enabled": True, "dm_policy": "open"}})
    async with running_gateway(cfg) as gw:
        [pond] = sys.modules["pond_channel"].ADAPTERS
        assert gw.status()["channels"]["pond"]["state"] == "connected"
        outcome = await pond.deliver(InboundMessage(channel="", text="hello pond",
                                                    sender_id="frog-1", message_id="p-9"))
        assert outcome == "queued"
        await until(lambda: pond.sent, what="the reply")
    assert pond.reactions == [("frog-1", "p-9", "🐸")]
    parts = [text for _, text in pond.sent]
    assert len(parts) >= 2 and all(len(p) <= 60 for p in parts)
    assert " ".join(parts).split() == ["Ribbit."] * 12


STARTS = '''
import asyncio
from channels.sdk import AccountConfig, ChannelAdapter, ChannelPlugin, sent

class Config(AccountConfig):
    enabled: bool = False

EVENTS = []

class Adapter(ChannelAdapter):
    name = "{name}"

    async def open(self):
        EVENTS.append("open")
        if "{how}" == "stall":  # a connect to a black-holed host, no timeout of its own
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                EVENTS.append("cancelled")
                raise
        if "{how}" == "fail":
            raise ConnectionError("open exploded")
        self.set_state("connected")

    async def close(self):
        if "{how}" == "closehang":  # a close() that never returns
            EVENTS.append("close")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                EVENTS.append("close-cancelled")
                raise

    async def send(self, message):
        return sent("1")

PLUGIN = ChannelPlugin(name="{name}", config=Config,
                       create=lambda account, config, context: Adapter(account, config, context))
'''


def install_starts(site_dir) -> dict:
    """Three channel plugins whose open() stalls, raises and connects (config section)."""
    for name, how in (("stall", "stall"), ("fail", "fail"), ("quick", "ok")):
        install(site_dir, f"tidegate-{name}", name, f"{name}_channel",
                STARTS.format(name=name, how=how))
    return {n: {"enabled": True} for n in ("stall", "fail", "quick")}


async def test_a_channel_whose_open_hangs_or_raises_fails_alone(site_dir, tmp_path):
    """Channels start concurrently, each for at most gateway.channel_start_timeout on the
    gateway clock: a hung open() is cancelled at the limit and that channel is failed with
    its error, a raising one too; the other channel connects and the gateway is ready."""
    cfg = base_config(tmp_path / "state", channels=install_starts(site_dir))
    cfg["gateway"]["channel_start_timeout"] = "20s"
    clock = FakeClock()
    gw = Gateway(parse_config(cfg, "test", env={}), clock=clock)
    start = asyncio.ensure_future(gw.start())
    try:
        await until(lambda: "open" in getattr(sys.modules.get("stall_channel"), "EVENTS",
                                              ()), what="the stalled open()")
        await clock.settle()
        assert not start.done()  # held by the stalled open() until the limit
        assert gw.status()["channels"]["quick"]["state"] == "connected"  # not behind it
        await clock.advance(20)
        await asyncio.wait_for(start, 5)
        assert gw.ready
        status = gw.status()["channels"]
        assert status["quick"]["state"] == "connected"
        assert (status["stall"]["state"], status["stall"]["last_error"]) == (
            "failed", "start timed out after 20s")
        assert (status["fail"]["state"], status["fail"]["last_error"]) == (
            "failed", "ConnectionError: open exploded")
        assert sys.modules["stall_channel"].EVENTS == ["open", "cancelled"]
        assert "channel stall:default failed to start: start timed out after 20s" in \
            gw.status()["problems"]
    finally:
        start.cancel()
        await gw.stop()


async def test_a_stop_during_a_hung_channel_start_does_not_wait_for_it(site_dir, tmp_path):
    """SIGTERM while a channel's open() hangs (run.py sets gw.start_abort): the start
    gives up at once, without the clock moving, and the hung open() is cancelled."""
    cfg = base_config(tmp_path / "state", channels=install_starts(site_dir))
    gw = Gateway(parse_config(cfg, "test", env={}), clock=FakeClock())
    start = asyncio.ensure_future(gw.start())
    try:
        await until(lambda: "open" in getattr(sys.modules.get("stall_channel"), "EVENTS",
                                              ()), what="the stalled open()")
        gw.start_abort.set()
        await asyncio.wait_for(start, 5)
        assert gw.status()["channels"]["stall"]["last_error"] == (
            "start cancelled: the gateway is stopping")
        assert sys.modules["stall_channel"].EVENTS == ["open", "cancelled"]
    finally:
        start.cancel()
        await gw.stop()


async def test_a_channel_whose_close_hangs_does_not_hold_up_the_shutdown(site_dir, tmp_path):
    """A plugin whose close() never returns is given up on after 10 s of gateway time
    (logged channel_stop_timed_out); the stop finishes and the close is cancelled."""
    install(site_dir, "tidegate-closehang", "closehang", "closehang_channel",
            STARTS.format(name="closehang", how="closehang"))
    cfg = base_config(tmp_path / "state", channels={"closehang": {"enabled": True}})
    clock = FakeClock()
    gw = Gateway(parse_config(cfg, "test", env={}), clock=clock)
    await gw.start()
    stop = asyncio.ensure_future(gw.stop())
    await until(lambda: "close" in sys.modules["closehang_channel"].EVENTS,
                what="the hung close()")
    await clock.settle()
    assert not stop.done()
    await clock.advance(10)
    await asyncio.wait_for(stop, 5)
    assert sys.modules["closehang_channel"].EVENTS == ["open", "close", "close-cancelled"]


LEAKY = '''
from channels.sdk import AccountConfig, ChannelAdapter, ChannelPlugin, sent

class Config(AccountConfig):
    enabled: bool = False

class Adapter(ChannelAdapter):
    name = "leaky"

    async def open(self):  # an error that quotes the control API's bearer token
        token = (self.context.state_dir.parent / "gateway.token").read_text().strip()
        raise ConnectionError(f"401 from http://127.0.0.1/api/status (Bearer {token})")

    async def send(self, message):
        return sent("1")

PLUGIN = ChannelPlugin(name="leaky", config=Config,
                       create=lambda account, config, context: Adapter(account, config, context))
'''


async def test_the_gateway_token_never_shows_in_status_problems(site_dir, tmp_path):
    """A channel error that quotes the gateway's (generated) token: status problems and
    the channel's last_error show it as [redacted:gateway.token]."""
    import json
    install(site_dir, "tidegate-leaky", "leaky", "leaky_channel", LEAKY)
    cfg = base_config(tmp_path / "state", channels={"leaky": {"enabled": True}})
    gw = Gateway(parse_config(cfg, "test", env={}), clock=FakeClock())
    await gw.start()
    try:
        status = gw.status()
        assert gw.token and gw.token not in json.dumps(status)
        assert ("channel leaky:default failed to start: ConnectionError: 401 from "
                "http://127.0.0.1/api/status (Bearer [redacted:gateway.token])"
                in status["problems"])
        assert status["channels"]["leaky"]["last_error"].endswith(
            "(Bearer [redacted:gateway.token])")
    finally:
        await gw.stop()


MUTE = '''
from channels.sdk import AccountConfig, ChannelAdapter, ChannelPlugin, sent

class Config(AccountConfig):
    enabled: bool = False

class Adapter(ChannelAdapter):
    name = "mute"

    async def open(self):  # never connects, never says why
        self.set_state("reconnecting")

    async def send(self, message):
        return sent("1")

PLUGIN = ChannelPlugin(name="mute", config=Config,
                       create=lambda account, config, context: Adapter(account, config, context))
'''


async def test_an_unhealthy_channel_without_an_error_says_none_was_recorded(site_dir,
                                                                           tmp_path):
    install(site_dir, "tidegate-mute", "mute", "mute_channel", MUTE)
    cfg = base_config(tmp_path / "state", channels={"mute": {"enabled": True}})
    clock = FakeClock()
    gw = Gateway(parse_config(cfg, "test", env={}), clock=clock)
    await gw.start()
    try:
        gw.channel_health.check()
        await clock.advance(121)  # past the default unhealthy_after (120 s)
        gw.channel_health.check()
        [line] = [p for p in gw.status()["problems"] if p.startswith("channel mute")]
        assert line.endswith("; last error: none recorded"), line
    finally:
        await gw.stop()


BARE = '''
from channels.sdk import AccountConfig, ChannelPlugin, PlatformSection

class Config(PlatformSection, AccountConfig):  # enabled, accounts, _problems: the SDK's
    pass

PLUGIN = ChannelPlugin(name="bare", config=Config, create=lambda a, c, ctx: None)
'''

BENT = '''
from channels.sdk import AccountConfig, ChannelPlugin, PlatformSection

class Config(PlatformSection, AccountConfig):
    _problems = staticmethod(lambda account: None)  # not a list: TypeError in validation

PLUGIN = ChannelPlugin(name="bent", config=Config, create=lambda a, c, ctx: None)
'''


def test_platform_section_gives_enabled_accounts_and_no_problems(site_dir):
    """A config model extending PlatformSection gets enabled, accounts.<id> (inheriting
    the section's keys) and an empty _problems from the SDK, as the plugins page says."""
    install(site_dir, "tidegate-bare", "bare", "bare_channel", BARE)
    from channels.config import account_configs
    cfg = parse_config({"channels": {"bare": {"enabled": True, "dm_policy": "open",
                                              "accounts": {"a": {}, "b": {"enabled": False}}}}},
                       "test", env={}).config
    section = cfg.channels.platform("bare")
    assert section.enabled and list(account_configs(section)) == ["a"]
    assert account_configs(section)["a"].dm_policy == "open"
    assert parse_config({"channels": {"bare": {"enabled": True}}}, "test", env={})


KELP = '''
from __future__ import annotations

from pydantic import Field, field_validator
from channels.sdk import AccountConfig, ChannelPlugin, PlatformSection

class Config(PlatformSection, AccountConfig):
    room: str = Field("#lobby", description="The room joined.")
    port: int = Field(6697, ge=1, le=65535, description="Server port.")
    token: str | None = Field(None, description="Bot token.")
    _problems = staticmethod(lambda acc: [] if acc.token else ["token: required"])

    @field_validator("room")
    @classmethod
    def _room(cls, value: str) -> str:
        if not value.startswith("#"):
            raise ValueError("a room starts with #")
        return value

PLUGIN = ChannelPlugin(name="kelp", config=Config, create=lambda a, c, ctx: None)
'''


def test_accounts_of_a_plugin_section_have_its_typed_keys_and_validation(site_dir):
    """The keys a plugin declares on its section class are its accounts' too: inherited
    from the section unless an account sets them, validated by the plugin's types and
    validators, a bad one named by its full key path; its required-key check runs on
    every enabled account."""
    install(site_dir, "tidegate-kelp", "kelp", "kelp_channel", KELP)
    from channels.config import account_configs
    section = parse_config({"channels": {"kelp": {
        "enabled": True, "room": "#tides", "token": "t", "dm_policy": "open",
        "accounts": {"a": {"port": 7000}, "b": {"room": "#kelp", "enabled": False}}}}},
        "test", env={}).config.channels.platform("kelp")
    [a] = account_configs(section).values()
    assert (a.room, a.port, a.token, a.dm_policy, a.enabled) == ("#tides", 7000, "t", "open",
                                                                  True)
    assert section.accounts["b"].room == "#kelp" and not section.accounts["b"].enabled
    assert problems({"channels": {"kelp": {"enabled": True, "token": "t", "accounts": {
        "a": {"port": 0}, "b": {"room": "kelp"}, "c": {"colour": "red"},
        "d": {"token": None}}}}}) == [
        "channels.kelp.accounts.a.port: Input should be greater than or equal to 1 (got 0)",
        "channels.kelp.accounts.b.room: a room starts with #",
        "channels.kelp.accounts.c.colour: unknown key"]
    assert problems({"channels": {"kelp": {"enabled": True, "accounts": {
        "a": {"token": "t"}, "d": {}}}}}) == ["channels.kelp.accounts.d.token: required"]
    # a section-level unknown key is reported once, where it was written
    assert problems({"channels": {"kelp": {"enabled": True, "token": "t", "bogus": 1,
                                           "accounts": {"a": {}}}}}) == \
        ["channels.kelp.bogus: unknown key"]


def test_a_plugin_config_model_that_breaks_is_one_problem_and_a_doctor_failure(site_dir):
    install(site_dir, "tidegate-bent", "bent", "bent_channel", BENT)
    [line] = problems({"channels": {"bent": {"enabled": True}}})
    assert line.startswith("channels.bent: the config model of channel plugin 'bent' is "
                           "broken (TypeError: ")
    code, text = run_cli("plugins", "doctor")
    assert code == 1
    assert "FAIL  channel bent (tidegate-bent 1.2.3): the config model of channel plugin " \
        "'bent' is broken (TypeError: " in text


def test_the_gateway_logs_a_configured_broken_plugin_in_its_json_log(site_dir, tmp_path):
    """The config is loaded before the log is set up: the plugin_load_failed line of a
    configured plugin that fails to import is held back and written to gateway.jsonl.
    (The run ends at once: its port is taken.)"""
    import json
    import socket

    import yaml

    from gateway.service.run import run_gateway
    install(site_dir, "tidegate-broken", "broken", "broken_channel",
            "import not_a_module_anywhere\n")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        cfg = base_config(tmp_path / "state", channels={"broken": {"enabled": True}})
        cfg["gateway"]["port"] = taken.getsockname()[1]
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        assert run_gateway(str(path)) == 1
    finally:
        taken.close()
    lines = [json.loads(x) for x in (tmp_path / "state" / "logs" / "gateway.jsonl")
             .read_text().splitlines()]
    [failed] = [x for x in lines if x.get("event") == "plugin_load_failed"]
    assert failed["plugin"] == "broken" and "not_a_module_anywhere" in failed["traceback"]


async def test_a_refused_message_is_kept_in_the_ledger_only_as_a_hash(site_dir, tmp_path):
    """A message the access policy refuses is recognised when the platform delivers it
    again, but inbound-seen.jsonl holds neither its sender nor its message id."""
    install(site_dir, "tidegate-pond", "pond", "pond_channel", POND)
    from channels.sdk import InboundMessage
    cfg = base_config(tmp_path / "state", channels={"pond": {
        "enabled": True, "dm_policy": "allowlist", "allow_from": ["frog-1"]}})
    async with running_gateway(cfg) as gw:
        [pond] = sys.modules["pond_channel"].ADAPTERS

        def stranger() -> InboundMessage:
            return InboundMessage(channel="", text="let me in", sender_id="toad-77",
                                  peer_id="toad-77", message_id="msg-4471")
        assert await pond.deliver(stranger()) == "denied"
        assert await pond.deliver(stranger()) == "duplicate"
    ledger = (tmp_path / "state" / "channels" / "inbound-seen.jsonl").read_text()
    assert "refused:" in ledger
    assert "toad-77" not in ledger and "msg-4471" not in ledger
