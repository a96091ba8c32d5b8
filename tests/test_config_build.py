"""What building the config costs at start (issue 9, cold start to the first answer): the
config models are built when a config has their section (``runtime.config_types.Lazy``),
a section left out is its defaults without a validator, the agent settings model is built
once, aliases come from ``camel_alias``, and no pydantic plugin loader is imported.

The start checks run in a fresh interpreter and report ``__pydantic_complete__`` (the
model's validator was built) as JSON; the equivalence checks walk every config model."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import typing

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from gateway.config.schema import Config
from runtime.config_types import ConfigModel, camel_alias, config_fields, section_defaults
from tests.helpers import ROOT

# Sections a minimal config leaves out: none of them may be built at its start.
OPTIONAL = ["channels.telegram.config.TelegramChannelConfig",
            "channels.telegram.config.TelegramAccount",
            "channels.slack.config.SlackChannelConfig",
            "channels.discord.config.DiscordChannelConfig",
            "channels.config.ChannelsConfig", "runtime.mcp.config.McpSection",
            "runtime.mcp.config.McpServerConfig", "runtime.media.config.MediaSettings",
            "runtime.tools.config.ToolsSection", "runtime.tools.web.config.WebSettings",
            "runtime.skills.config.SkillsSection", "runtime.usage.config.BudgetsSection",
            "runtime.storage.config.StorageSection", "gateway.cluster.config.ClusterSection"]

START = """
    import asyncio, importlib, json, sys, tempfile
    from pathlib import Path

    import pydantic._internal._model_construction as construction
    built = []
    complete = construction.complete_model_class
    def recording(cls, *args, **kwargs):
        built.append(cls.__name__)
        return complete(cls, *args, **kwargs)
    construction.complete_model_class = recording

    import gateway.cli  # the command line's own start (lean_imports)
    from tests.fakes.fake_openai import FakeOpenAI

    def models(names):
        out = {}
        for name in names:
            module, _, cls = name.rpartition(".")
            out[cls] = getattr(importlib.import_module(module), cls).__pydantic_complete__
        return out

    async def main():
        async with FakeOpenAI() as fake:
            from gateway.config.load import parse_config
            from gateway.service.daemon import Gateway
            state = Path(tempfile.mkdtemp())
            cfg = {"gateway": {"state_dir": str(state), "port": 0},
                   "models": {"providers": {"fake": {
                       "api": "openai", "base_url": fake.base_url, "api_key": "sk-x"}}},
                   "agents": {"defaults": {"model": "fake/fake-model"}}}
            cfg.update(json.loads(sys.argv[1]))
            loaded = parse_config(cfg, "test", env={})
            gw = Gateway(loaded)
            await gw.start()
            fake.script_text("hello")
            answer = (await gw.local.send("hi")).text
            c = loaded.config
            out = {"answer": answer, "built": built,
                   "models": models(json.loads(sys.argv[2])),
                   "plugins": sys.modules["pydantic.plugin._loader"]._plugins,
                   "values": [c.channels.telegram.enabled, c.tools.web.fetch.timeout,
                              c.storage.pool.max, c.agent("main").subagents.tools.deny]}
            await gw.stop()
        print(json.dumps(out))

    asyncio.run(main())
"""


def _start(sections: dict, names: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(START), json.dumps(sections),
                        json.dumps(names)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_minimal_start_builds_no_model_of_a_section_it_leaves_out():
    """Before: every config model was built when its module was imported (~110 ms), and
    the agent settings twice more (``agents.defaults`` and the merged agent)."""
    got = _start({}, OPTIONAL + ["gateway.config.agents.AgentSettings"])
    assert got["answer"] == "hello"
    assert got["models"].pop("AgentSettings") is True
    assert got["models"] == dict.fromkeys([n.rsplit(".", 1)[1] for n in OPTIONAL], False)
    assert got["built"].count("AgentSettings") == 1 and "AgentDefaults" not in got["built"]
    # left-out sections still read as their defaults
    assert got["values"] == [False, 20.0, 10, ["sessions_spawn", "cron", "message"]]
    assert got["plugins"] == {}  # no plugin search (lean_imports preset an empty one)


def test_a_section_the_config_has_is_built_and_validated():
    got = _start({"channels": {"telegram": {"enabled": False, "pollTimeout": "45s"}},
                  "tools": {"web": {"fetch": {"timeout": "5s"}}}}, OPTIONAL)
    assert got["answer"] == "hello"
    built = {name for name, done in got["models"].items() if done}
    assert built == {"ChannelsConfig", "TelegramChannelConfig", "ToolsSection"}
    assert got["values"][:2] == [False, 5.0]


def _problems(data: dict) -> list[str]:
    from gateway.config.load import ConfigError, parse_config
    try:
        parse_config(data, "test", env={})
    except ConfigError as exc:
        return exc.problems
    raise AssertionError("config was accepted")


def test_errors_in_a_lazily_built_section_name_the_full_path():
    problems = _problems({"channels": {"telegram": {
        "enabled": True, "tokn": "x", "pollTimeout": "soon",
        "accounts": {"work": {"mode": "webhook", "token": "t"}}}},
        "mcp": {"servers": {"a": {"command": "x", "start": "later"}}},
        "models": {"providers": {"p": {"api": "grpc"}}}})
    assert "channels.telegram.tokn: unknown key (did you mean 'token'?)" in problems
    assert any(p.startswith("channels.telegram.pollTimeout: expected a duration")
               for p in problems)
    assert "mcp.servers.a.start: expected gateway or lazy" in problems
    assert any(p.startswith("models.providers.p.api: Input should be 'openai' or "
                            "'anthropic'") for p in problems)
    assert _problems({"channels": {"telegram": {"enabled": True, "accounts": {
        "work": {"mode": "webhook", "token": "t"}}}}}) == [
        ("channels.telegram.accounts.work.webhook_secret: required for mode webhook: 1-256 "
         "characters of A-Z a-z 0-9 _ - (Telegram's rule)")]
    assert _problems({"agents": {"defaults": {"exec": {"timeout": "x"}}}})[0].startswith(
        "agents.defaults.exec.timeout: expected a duration")


def _config_models() -> list[type[ConfigModel]]:
    seen: list[type[ConfigModel]] = []

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.append(model)
        for field in config_fields(model).values():
            for inner in _models_in(field.annotation):
                walk(inner)

    walk(Config)
    return seen


def _models_in(t: object) -> list[type[BaseModel]]:
    if isinstance(t, type) and issubclass(t, BaseModel):
        return [t]
    return [m for arg in typing.get_args(t) for m in _models_in(arg)]


def test_camel_alias_is_pydantics_to_camel_for_every_field():
    names = {n for model in _config_models() for n in model.model_fields}
    assert len(names) > 200
    names |= {"v1beta", "x_1", "_private", "a__b", "trailing_", "HTTP_proxy", "gpt4o_mini",
              "already", "max_2x_size"}
    assert {n: camel_alias(n) for n in names} == {n: to_camel(n) for n in names}


def _same(a: object, b: object, path: str) -> None:
    assert type(a) is type(b), path
    if isinstance(a, BaseModel):
        assert a.model_fields_set == b.model_fields_set, path
        for name in type(a).model_fields:
            _same(getattr(a, name), getattr(b, name), f"{path}.{name}")
    else:
        assert a == b, path


def test_section_defaults_equal_validating_an_empty_section():
    """A section left out is made from its defaults without validation; for every config
    model it must be exactly what validating ``{}`` gives (values, nested model types,
    ``model_fields_set``), or the shortcut would change a config."""
    checked = 0
    for model in _config_models():
        try:
            validated = model.model_validate({})
        except ValidationError:  # required keys: never a left-out section
            continue
        made = section_defaults(model)
        _same(made, validated, model.__name__)
        assert made.model_dump() == validated.model_dump()
        checked += 1
    assert checked > 50


def test_section_defaults_of_a_model_with_a_required_field_do_not_raise():
    """An installed channel plugin may declare a field without a default (``url: str``);
    a config that leaves its section out must still load (it crashed every command that
    listed the channels with KeyError: 'url')."""
    from channels.sdk import AccountConfig, PlatformSection

    class Required(PlatformSection, AccountConfig):
        url: str
        retries: int = 3

    made = section_defaults(Required)
    assert made.retries == 3 and made.enabled is False
