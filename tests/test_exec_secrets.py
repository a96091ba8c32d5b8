"""Secrets the model never sees (docs/exec.md): exec children get an allowlisted
environment, and a configured secret value in any tool result reaches the model, the
transcript, the timeline and the log only as ``[redacted:NAME]``."""

from __future__ import annotations

import io
import json
import sqlite3

import pytest
import structlog

from gateway.config.load import ConfigError, parse_config
from gateway.logs.pipeline import close_logging, configure_logging
from gateway.logs.redact import config_secrets
from gateway.service.daemon import Gateway
from tests.channel_harness import write_config
from tests.helpers import base_config

pytestmark = pytest.mark.timeout(30)

KEY = "agent:main:cli:dm:local"
OPENAI_KEY = "sk-live-0123456789abcdefXYZ"
BOT_TOKEN = "7000001:AAHtidegateTESTtokenvalue0123456789"
UNREFERENCED = "unreferenced-gateway-variable-42"


def _config(tmp_path, model_url: str, **exec_rules) -> dict:
    cfg = base_config(tmp_path / "state", model_url)
    cfg["models"]["providers"]["fake"]["api_key"] = "${OPENAI_API_KEY}"
    cfg["channels"] = {"telegram": {"enabled": False, "token": "${TELEGRAM_BOT_TOKEN}"}}
    cfg["agents"]["defaults"]["tools"] = {"exec": {"env": {"PROJECT": "tidegate"},
                                                   **exec_rules}}
    return cfg


@pytest.fixture
def secret_env(monkeypatch):
    env = {"OPENAI_API_KEY": OPENAI_KEY, "TELEGRAM_BOT_TOKEN": BOT_TOKEN,
           "TIDEGATE_EXTRA": UNREFERENCED}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


async def test_exec_env_is_allowlisted_and_secrets_reach_the_model_redacted(
        tmp_path, model, secret_env):
    loaded = parse_config(_config(tmp_path, model.base_url), "test", env=secret_env)
    gw = Gateway(loaded)
    await gw.start()
    try:
        ws = gw.config.workspace_for("main")
        ws.mkdir(parents=True, exist_ok=True)
        (ws / "leak.txt").write_text(f"OPENAI_API_KEY={OPENAI_KEY}\nbot: {BOT_TOKEN}\n")
        model.script_tool_calls([
            {"id": "c1", "name": "exec", "arguments": {"command": "env"}},
            {"id": "c2", "name": "read", "arguments": {"path": "leak.txt"}},
            {"id": "c3", "name": "exec", "arguments": {"command": "cat leak.txt"}},
            {"id": "c4", "name": "exec", "arguments": {
                "command": f"cat {gw.state_dir.resolve() / 'gateway.token'}"}}])
        model.script_text("done")
        result = await gw.local.send("show me", session_key=KEY)
        assert result.text == "done"
    finally:
        await gw.stop()
    tool_msgs = {m["tool_call_id"]: m["content"] for m in model.requests[-1].json["messages"]
                 if m["role"] == "tool"}
    env_lines = dict(line.split("=", 1) for line in
                     tool_msgs["c1"].splitlines()[1:] if "=" in line)
    # only the allowlist: PATH (LANG/TZ when set), HOME = the workspace, tools.exec.env
    assert env_lines["HOME"] == str(ws) and env_lines["PROJECT"] == "tidegate"
    assert "PATH" in env_lines
    assert set(env_lines) - {"PATH", "LANG", "TZ", "HOME", "PROJECT", "PWD", "SHLVL", "_"} \
        == set(), env_lines
    assert UNREFERENCED not in tool_msgs["c1"]
    # the gateway's own control token is a secret too, though no config names it
    assert gw.token not in tool_msgs["c4"] and "[redacted:gateway.token]" in tool_msgs["c4"]
    for text in (tool_msgs["c2"], tool_msgs["c3"]):
        assert OPENAI_KEY not in text and BOT_TOKEN not in text
        assert "[redacted:OPENAI_API_KEY]" in text and "[redacted:TELEGRAM_BOT_TOKEN]" in text
    state = tmp_path / "state"
    transcript = (state / "agents/main/sessions" / f"{result.session_id}.jsonl").read_text()
    assert "[redacted:OPENAI_API_KEY]" in transcript
    conn = sqlite3.connect(state / "timeline.db")
    timeline = json.dumps([r for r in conn.execute("SELECT content FROM timeline_events")])
    conn.close()
    assert "[redacted:OPENAI_API_KEY]" in timeline
    for blob in (transcript, timeline):
        assert OPENAI_KEY not in blob and BOT_TOKEN not in blob


def test_the_log_redacts_secrets_referenced_by_a_secret_name_anywhere(tmp_path, secret_env):
    """``${OPENAI_API_KEY}`` inside a URL (no secret-looking key above it) is still a
    secret of the log: the gateway hands every named secret to the redactor."""
    plain = "plainvalue-9f8e7d6c5b"  # no token shape: only the configured set hides it
    cfg = base_config(tmp_path / "state", "http://127.0.0.1:9/v1?k=${MY_SERVICE_KEY}")
    loaded = parse_config(cfg, "test", env={**secret_env, "MY_SERVICE_KEY": plain})
    configure_logging(state_dir=tmp_path, stream=io.StringIO(),
                      secrets=config_secrets(loaded))
    try:
        structlog.get_logger("t").warning("provider_url", url=f"seen {plain} here")
    finally:
        close_logging()
    line = (tmp_path / "logs/gateway.jsonl").read_text()
    assert "provider_url" in line and plain not in line


def test_exec_env_naming_a_secret_is_a_config_error_naming_the_key(tmp_path, secret_env):
    cfg = _config(tmp_path, "http://127.0.0.1:9/v1")
    cfg["agents"]["defaults"]["tools"]["exec"]["env"]["KEY_FOR_TOOLS"] = "${OPENAI_API_KEY}"
    with pytest.raises(ConfigError) as err:
        parse_config(cfg, "test", env=secret_env)
    assert err.value.problems == [(
        "agents.defaults.tools.exec.env.KEY_FOR_TOOLS: references OPENAI_API_KEY, a "
        "configured secret; commands never get secrets")]
    assert OPENAI_KEY not in err.value.render()


@pytest.mark.parametrize("strict", [True, False])
def test_exec_env_embedding_a_secret_anywhere_is_a_config_error_naming_the_key(
        tmp_path, secret_env, strict):
    """Not only a whole-value reference: a secret variable inside a longer value, a
    variable the config uses as a secret elsewhere, or a literal secret in the value."""
    literal = "xoxb-literal-0123456789-abcdef"
    cfg = _config(tmp_path, "http://127.0.0.1:9/v1")
    cfg["channels"]["slack"] = {"enabled": False, "bot_token": literal}
    cfg["models"]["providers"]["fake"]["api_key"] = "${MY_PROVIDER_CRED}"  # used as a secret
    env = cfg["agents"]["defaults"]["tools"]["exec"]["env"]
    env.update({"GH": "prefix-${GITHUB_TOKEN}-suffix", "AUTH": "Bearer ${MY_PROVIDER_CRED}",
                "SLACK": f"token={literal}", "FINE": "${HOME_DIR:-/srv}/x"})
    with pytest.raises(ConfigError) as err:
        parse_config(cfg, "test", env={**secret_env, "GITHUB_TOKEN": "ghp_0123456789abcdef",
                                       "MY_PROVIDER_CRED": "cred-0123456789"},
                     strict_env=strict)
    assert err.value.problems == [
        ("agents.defaults.tools.exec.env.AUTH: references MY_PROVIDER_CRED, a configured "
         "secret; commands never get secrets"),
        ("agents.defaults.tools.exec.env.GH: references GITHUB_TOKEN, a configured secret; "
         "commands never get secrets"),
        ("agents.defaults.tools.exec.env.SLACK: is a configured secret; commands never get "
         "secrets")]
    for value in ("ghp_0123456789abcdef", "cred-0123456789", literal):
        assert value not in err.value.render()


async def test_env_file_secrets_are_scrubbed_even_when_the_config_never_names_them(
        tmp_path, model):
    from gateway.config.env_file import EnvFileChoice
    from gateway.config.load import load_config
    token = "ghp_unreferenced0123456789abcdef"
    state = tmp_path / "state"
    state.mkdir()
    (state / "tidegate.env").write_text(f"GITHUB_TOKEN={token}\nPLAIN_SETTING=visible-42\n")
    (state / "tidegate.env").chmod(0o600)
    path = write_config(tmp_path, base_config(state, model.base_url))
    loaded = load_config(path, env={}, env_file=EnvFileChoice())
    gw = Gateway(loaded)
    await gw.start()
    try:
        ws = gw.config.workspace_for("main")
        ws.mkdir(parents=True, exist_ok=True)
        (ws / "notes.txt").write_text(f"token {token}, setting visible-42\n")
        model.script_tool_call("read", {"path": "notes.txt"}, call_id="r")
        model.script_text("read")
        await gw.local.send("read it", session_key=KEY)
    finally:
        await gw.stop()
    [result] = [m["content"] for m in model.requests[-1].json["messages"]
                if m["role"] == "tool"]
    assert token not in result and "[redacted:GITHUB_TOKEN]" in result
    assert "visible-42" in result  # not secret-named: left alone


@pytest.mark.parametrize(("dsn", "password"), [
    ("postgresql://tide:pg-s3cret-pw@db.internal:5432/tidegate", "pg-s3cret-pw"),
    ("postgresql://db.internal/tidegate?password=pg-s3cret-pw", "pg-s3cret-pw"),
    ("host=db.internal password='pg-s3cret-pw' dbname=tidegate", "pg-s3cret-pw"),
    ("postgresql://db.internal/tidegate", None)])
def test_a_literal_dsn_password_is_a_runtime_secret(dsn, password):
    from types import SimpleNamespace

    from gateway.tools.context import runtime_secrets
    gw = SimpleNamespace(token="tok-0123456789", config=SimpleNamespace(
        storage=SimpleNamespace(dsn=dsn)))
    found = runtime_secrets(gw)
    assert found["gateway.token"] == "tok-0123456789"
    assert found.get("storage.dsn.password") == password


def test_the_secret_scan_is_bounded_and_survives_garbage():
    """runtime/tools/secret_scan.py: nesting deeper than MAX_DEPTH and bytes past the
    inflate budget are not looked at (a zip bomb costs no more than the budget); broken
    containers are plain bytes, never an error."""
    import gzip

    from runtime.tools.secret_scan import MAX_DEPTH, holds
    needle = b"sk-live-abcdef123456"
    blob = needle
    for _ in range(MAX_DEPTH):
        blob = gzip.compress(blob)
    assert holds(blob, [needle]) == {needle}
    assert holds(gzip.compress(blob), [needle]) == set()  # one level too deep
    bomb = gzip.compress(b"\0" * 10_000_000 + needle)
    assert holds(bomb, [needle], limit=1_000_000) == set()
    assert holds(bomb, [needle]) == {needle}
    for broken in (b"\x1f\x8b\x08garbage", b"BZh9nonsense", b"\xfd7zXZ\x00bad",
                   b"PK\x03\x04broken", gzip.compress(needle)[:-12]):
        holds(broken, [needle])  # no exception
    assert holds(gzip.compress(needle)[:-8], [needle]) == {needle}  # truncated trailer


def test_an_env_file_secret_the_config_never_names_cannot_be_written_into_exec_env(
        tmp_path, model):
    """The env file's secret-named value, copied literally into ``tools.exec.env``, is a
    config error naming the key (the value never in the message); a plain env-file
    setting may be."""
    from gateway.config.env_file import EnvFileChoice
    from gateway.config.load import load_config
    token = "ghp_unreferenced0123456789abcdef"
    state = tmp_path / "state"
    state.mkdir()
    (state / "tidegate.env").write_text(f"GITHUB_TOKEN={token}\nPLAIN_SETTING=visible-42\n")
    (state / "tidegate.env").chmod(0o600)
    cfg = base_config(state, model.base_url)
    cfg["agents"]["defaults"]["tools"] = {"exec": {"env": {
        "GH_AUTH": f"Bearer {token}", "PLAIN": "visible-42"}}}
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path, cfg), env={}, env_file=EnvFileChoice())
    assert err.value.problems == [
        "agents.defaults.tools.exec.env.GH_AUTH: is a configured secret; commands never "
        "get secrets"]
    assert token not in err.value.render()
    del cfg["agents"]["defaults"]["tools"]["exec"]["env"]["GH_AUTH"]
    loaded = load_config(write_config(tmp_path, cfg), env={}, env_file=EnvFileChoice())
    assert loaded.config.agent("main").tools.exec.env == {"PLAIN": "visible-42"}
