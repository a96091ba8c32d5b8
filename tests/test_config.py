"""Config loading and validation (issue 2 §2): every problem named by its dotted path, all
at once, exit code 2, no traceback, and the gateway does not start."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config.load import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent


def tidegate(*args, env=None, timeout=30):
    e = {k: v for k, v in os.environ.items() if k not in ("TIDEGATE_CONFIG",
                                                          "TIDEGATE_STATE_DIR")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True,
                          text=True, env=e, cwd=ROOT, timeout=timeout)


BAD = {
    "wrong type": ("gateway:\n  port: not-a-number\n", "gateway.port:"),
    "unknown key": ("gateway:\n  prot: 1\n", "gateway.prot: unknown key"),
    "missing token": ("channels:\n  telegram:\n    enabled: true\n",
                      "channels.telegram.token: required"),
    "bad duration": ("gateway:\n  shutdown_grace: soon\n",
                     "gateway.shutdown_grace: expected a duration"),
    "bad yaml": ("gateway:\n  port: [1, 2\n", "<yaml>:"),
    "key=value dsn": ("storage:\n  backend: postgres\n  dsn: host=db password=hunter2\n",
                      "storage.dsn: expected a postgresql://"),
    "unset env": ("models:\n  providers:\n    o: {api: openai, api_key: '${NO_SUCH_VAR_X}'}\n",
                  "models.providers.o.api_key: environment variable NO_SUCH_VAR_X is not set"),
    "misspelt provider in a policy key": (
        ("models:\n  providers:\n    openai: {api: openai, api_key: sk-x}\n"
        "tools:\n  by_provider:\n    opnai: {deny: [exec]}\n"),
        "tools.by_provider.opnai: unknown provider 'opnai' (did you mean 'openai'?)"),
}


def test_policy_keys_of_agents_name_known_providers_and_agents():
    """A misspelt name in a policy key used to disable that rule silently."""
    providers = {"models": {"providers": {"openai": {"api": "openai", "api_key": "k"}}}}
    for cfg, expected in (
            ({**providers, "agents": {"list": [{"id": "ops", "tools": {"by_provider": {
                "opnai": {"deny": ["exec"]}}}}]}},
             ("agents.list.ops.tools.by_provider.opnai: unknown provider 'opnai' "
             "(did you mean 'openai'?)")),
            ({**providers, "agents": {"defaults": {"tools": {"by_provider": {
                "anthropic": {"deny": ["exec"]}}}}}},
             ("agents.defaults.tools.by_provider.anthropic: unknown provider 'anthropic'; "
             "have: echo, openai")),
            ({"agents": {"list": [{"id": "main"}, {"id": "ops"}]},
              "budgets": {"per_agent": {"opz": {"daily_usd": 1}}}},
             "budgets.per_agent.opz: unknown agent (did you mean 'ops'?)")):
        with pytest.raises(ConfigError) as exc:
            parse_config(cfg, "t", env={})
        assert any(expected in p for p in exc.value.problems), exc.value.problems
    ok = {**providers, "tools": {"by_provider": {"openai/gpt-4o": {"deny": ["exec"]},
                                                 "echo": {"deny": []}}}}
    parse_config(ok, "t", env={})


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_one_clear_message_and_exit_2(tmp_path, case):
    text, expected = BAD[case]
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    for args in (["config", "validate", "--config", str(cfg)],
                 ["gateway", "--config", str(cfg)]):
        r = tidegate(*args, env={"TIDEGATE_STATE_DIR": str(tmp_path / "state")})
        assert r.returncode == 2, r.stderr
        assert expected in r.stderr
        assert "Traceback" not in r.stderr and "hunter2" not in r.stderr
    assert not (tmp_path / "state" / "gateway.json").exists()  # never started


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as exc:
        parse_config({"gateway": {"port": "x", "bogus": 1}, "messages": {"queue":
                      {"mode": "shout", "debounce": "later"}}}, "t", env={})
    paths = [p.split(":")[0] for p in exc.value.problems]
    assert paths == ["gateway.port", "gateway.bogus", "messages.queue.mode",
                     "messages.queue.debounce"]


def test_agent_list_typo_gets_a_suggestion_like_defaults():
    with pytest.raises(ConfigError) as exc:
        parse_config({"agents": {"list": [{"id": "a", "modle": "x"}]}}, "t", env={})
    assert exc.value.problems == ["agents.list.0.modle: unknown key (did you mean 'model'?)"]


def test_agent_list_errors_spell_keys_as_the_file_did():
    """camelCase in an ``agents.list`` entry is named camelCase back, nested keys too, as
    ``agents.defaults`` errors always were."""
    with pytest.raises(ConfigError) as exc:
        parse_config({"agents": {"defaults": {"contextTokens": "x"}, "list": [
            {"id": "a", "contextTokens": "y", "heartbeat": {"activeHours": 5}}]}},
            "t", env={})
    assert [p.split(":")[0] for p in exc.value.problems] == [
        "agents.defaults.contextTokens", "agents.list.0.contextTokens",
        "agents.list.0.heartbeat.activeHours"]


def test_agent_list_keeps_data_keys_as_written():
    """Only setting names are converted from camelCase in an ``agents.list`` entry: a
    model ref under ``tools.by_provider`` (``gpt-4o`` became ``gpt_4o``, so the rule never
    matched) and variable names under ``tools.exec.env`` (``MY_VAR`` became ``my_var``) are
    data and stay as written."""
    cfg = parse_config({"agents": {"list": [{"id": "ops", "maxTokens": 99, "tools": {
        "by_provider": {"echo/gpt-4o": {"deny": ["exec"]}},
        "exec": {"env": {"MY_VAR": "1", "HTTPProxy": "x"}}}}]}}, "t", env={}).config
    ops = cfg.agent("ops")
    assert list(ops.tools.by_provider) == ["echo/gpt-4o"]
    assert ops.tools.by_provider["echo/gpt-4o"].deny == ["exec"]
    assert ops.tools.exec.env == {"MY_VAR": "1", "HTTPProxy": "x"}
    assert ops.max_tokens == 99


def test_agent_list_problems_are_reported_with_those_of_the_defaults():
    with pytest.raises(ConfigError) as exc:
        parse_config({"agents": {"defaults": {"timeout": "soon"},
                                 "list": [{"id": "a", "bogus": 1}, {"id": "A"}]}}, "t", env={})
    assert [p.split(":")[0] for p in exc.value.problems] == [
        "agents.defaults.timeout", "agents.list.0.bogus", "agents.list.1.id"]


def test_env_substitution_with_defaults_and_camel_case_aliases():
    loaded = parse_config({
        "gateway": {"shutdownGrace": "5m", "authToken": "${TOK}"},
        "models": {"providers": {"local": {"api": "openai",
                                           "baseUrl": "${BASE:-http://127.0.0.1:11434/v1}"}}},
        "agents": {"defaults": {"model": "local/llama3", "userTimezone": "Europe/Berlin"},
                   "list": [{"id": "main"}, {"id": "ops", "timeout": "90s",
                                             "execTimeout": None} if False else
                            {"id": "ops", "timeout": "90s"}]},
        "messages": {"queue": {"mode": "followup", "debounce": "250ms"}},
    }, "t", env={"TOK": "s3cret"})
    cfg = loaded.config
    assert cfg.gateway.shutdown_grace == 300.0 and cfg.gateway.auth_token == "s3cret"
    assert cfg.models.providers["local"].base_url == "http://127.0.0.1:11434/v1"
    assert cfg.agent("ops").timeout == 90.0
    assert cfg.agent("ops").user_timezone == "Europe/Berlin"  # inherited from defaults
    assert cfg.agent("main").model_primary == "local/llama3"
    assert cfg.messages.queue.debounce == 0.25


def test_defaults_without_any_file(tmp_path, monkeypatch):
    monkeypatch.delenv("TIDEGATE_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    loaded = load_config(None)
    assert loaded.path is None
    cfg = loaded.config
    assert (cfg.gateway.bind, cfg.gateway.port, cfg.gateway.shutdown_grace) == \
        ("127.0.0.1", 18789, 30.0)
    assert cfg.session.dm_scope == "per-channel-peer"
    assert cfg.messages.queue.mode == "collect" and cfg.messages.queue.debounce == 1.0
    assert cfg.agent("main").timeout == 600.0
    assert cfg.lanes.main == 32 and cfg.lanes.cron == 4 and cfg.lanes.subagent == 16


def test_a_section_left_empty_means_its_defaults(tmp_path):
    """`channels:` whose children are all commented out is YAML null: the section's
    defaults, like an absent section (OpenClaw and nanobot read it the same way)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("channels:\n  # telegram:\n  #   token: x\nmessages:\n"
                   "gateway:\n  port: 1234\n")
    cfg_ = load_config(cfg, env={}).config
    assert cfg_.gateway.port == 1234 and cfg_.messages.queue.debounce == 1.0
    assert cfg_.channels.telegram is None or not cfg_.channels.telegram.enabled
    r = tidegate("config", "validate", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    with pytest.raises(ConfigError, match="channels.telegram"):  # a child stays checked
        parse_config({"channels": {"telegram": {"enabled": True}}}, "t", env={})


def test_config_env_var_and_missing_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("gateway:\n  port: 1234\n")
    r = tidegate("config", "validate", env={"TIDEGATE_CONFIG": str(cfg)})
    assert r.returncode == 0 and str(cfg) in r.stdout
    r = tidegate("config", "validate", "--config", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "file not found" in r.stderr


def test_example_config_is_valid():
    r = tidegate("config", "validate", "--config", str(ROOT / "config.example.yaml"),
                 env={"TELEGRAM_BOT_TOKEN": "1:x", "SLACK_BOT_TOKEN": "xoxb-1",
                      "SLACK_APP_TOKEN": "xapp-1", "DISCORD_BOT_TOKEN": "d",
                      "OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-ant-test"})
    assert r.returncode == 0, r.stderr


def test_control_api_must_stay_on_loopback():
    with pytest.raises(ConfigError, match="gateway.bind: must be a loopback"):
        parse_config({"gateway": {"bind": "0.0.0.0"}}, "t", env={})


def test_cli_commands_work_without_the_services_secret_env(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("gateway: {state_dir: %s}\n"
                   "models:\n  providers:\n    o: {api: openai, api_key: '${QA_UNSET_KEY}'}\n"
                   "agents: {defaults: {model: o/gpt}}\n" % (tmp_path / "state"))
    r = tidegate("sessions", "list", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    r = tidegate("status", "--config", str(cfg))
    assert r.returncode == 1 and "not running" in r.stdout  # not a config error
    r = tidegate("config", "validate", "--config", str(cfg))
    assert r.returncode == 2 and "QA_UNSET_KEY is not set" in r.stderr
    r = tidegate("gateway", "--config", str(cfg))
    assert r.returncode == 2 and "QA_UNSET_KEY is not set" in r.stderr


def test_non_utf8_config_is_a_clear_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"\x00\xff\xfe")
    r = tidegate("config", "validate", "--config", str(cfg))
    assert r.returncode == 2 and "not UTF-8" in r.stderr and "Traceback" not in r.stderr


def test_config_errors_never_echo_secret_values():
    env = {"OPENAI_API_KEY": "QAplainSecretValue987654"}
    with pytest.raises(ConfigError) as exc:
        parse_config({"gateway": {"auth_token": 12345, "port": "${OPENAI_API_KEY}"},
                      "models": {"providers": {"o": {"api": "openai",
                                                     "headers": "X-Key ${OPENAI_API_KEY}"}}}},
                     "t", env=env)
    text = "\n".join(exc.value.problems)
    assert "QAplainSecretValue987654" not in text and "12345" not in text
    assert "gateway.port" in text and "models.providers.o.headers" in text


@pytest.mark.parametrize("bad", ["../../../tmp/x", "a/b", "..", "x y", ""])
def test_agent_ids_cannot_name_paths(bad):
    with pytest.raises(ConfigError, match="agents.list.0.id"):
        parse_config({"agents": {"list": [{"id": bad}]}}, "t", env={})


def test_duplicate_yaml_keys_are_an_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("gateway:\n  port: 18789\n  port: 1\n")
    r = tidegate("config", "validate", "--config", str(cfg))
    assert r.returncode == 2 and "duplicate key 'port'" in r.stderr and "line 3" in r.stderr


def test_agent_command_reads_a_plain_gateway_section_without_pydantic(tmp_path):
    """``agent -m`` starts fast (bench/operator_bench.py): a plain ``gateway`` section is
    read without importing pydantic (and, as its own process, without ssl: the control
    API is plain HTTP on loopback); a section it cannot vouch for is validated by the
    schema, which names the bad key."""
    import subprocess
    import sys

    from gateway.config.quick import quick_gateway

    assert quick_gateway({"stateDir": "/s", "port": 0, "authToken": None}).state_dir == "/s"
    for bad in ({"port": "80"}, {"port": True}, {"bind": "0.0.0.0"}, {"prot": 1},
                {"port": 70000}, {"state_dir": "/a", "stateDir": "/b"}):
        assert quick_gateway(bad) is None, bad
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"gateway: {{state_dir: {tmp_path / 'state'}, port: 0}}\n"
                   "agents: {defaults: {model: x/y}}\n")
    probe = ("import sys; from gateway.cli import main; rc = main(); "
             "print('pydantic' in sys.modules, 'ssl' in sys.modules, rc)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    r = subprocess.run([sys.executable, "-c", probe, "--config", str(cfg), "agent", "-m", "hi"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.stdout.split() == ["False", "False", "1"], r.stdout + r.stderr  # nor ssl
    assert "no gateway is running for state dir" in r.stderr
    cfg.write_text("gateway: {port: eighty}\n")
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "--config", str(cfg), "agent",
                        "-m", "hi"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "gateway.port" in r.stderr, r.stderr


@pytest.mark.parametrize("text", ["gateway: []\n", "gateway: ''\n", "gateway: false\n"])
def test_control_commands_refuse_a_gateway_section_that_is_no_mapping(tmp_path, text):
    """`agent -m` / `gateway status` read only the gateway section; one that is not a
    mapping is refused as the full load refuses it, never read as the defaults (which
    could reach another installation's gateway on the default state dir)."""
    from gateway.config.load import load_gateway_section
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match="gateway: expected a mapping"):
        load_gateway_section(cfg, env={})
    with pytest.raises(ConfigError, match="gateway"):
        load_config(cfg, env={})
    cfg.write_text("gateway:\n")  # left empty: the defaults, for both
    assert load_gateway_section(cfg, env={}).config.gateway.port == 18789


def test_workspace_for_follows_the_settings_it_is_kept_for(tmp_path):
    """The path is kept (every turn asks) but never outlives the settings it came from."""
    from gateway.config.schema import GatewaySection

    loaded = parse_config({"gateway": {"state_dir": str(tmp_path / "a")},
                           "agents": {"list": [{"id": "main"},
                                               {"id": "ops", "workspace": str(tmp_path / "ws")}]}},
                          "t", env={})
    cfg = loaded.config
    assert cfg.workspace_for("main") == tmp_path / "a" / "workspace" / "main"
    assert cfg.workspace_for("main") is cfg.workspace_for("main")
    assert cfg.workspace_for("ops") == tmp_path / "ws"
    cfg.gateway = GatewaySection.model_validate({"state_dir": str(tmp_path / "b")})
    assert cfg.workspace_for("main") == tmp_path / "b" / "workspace" / "main"


def test_a_null_key_the_schema_does_not_know_is_still_named(tmp_path):
    """Only known sections may be left empty: a misspelt one (`chanels:` with its children
    commented out) is exit 2 naming it, as it is with children; the key=value DSN message
    survives the log redactor intact (it logs on a failed SIGHUP reload)."""
    from gateway.logs.redact import Redactor
    cfg = tmp_path / "c.yaml"
    cfg.write_text("chanels:\n  # telegram:\n  #   token: x\n")
    r = tidegate("config", "validate", "--config", str(cfg),
                 env={"TIDEGATE_STATE_DIR": str(tmp_path / "state")})
    assert r.returncode == 2 and "chanels: unknown key" in r.stderr, r.stderr
    with pytest.raises(ConfigError) as exc:
        parse_config({"storage": {"backend": "postgres", "dsn": "host=db password=pw12"}},
                     "t", env={})
    (problem,) = exc.value.problems
    assert Redactor().redact(problem) == problem and "pw12" not in problem
