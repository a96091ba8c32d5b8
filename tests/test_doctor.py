"""``tidegate doctor`` (issue 14): one test per check, each with a broken setup, plus
``--fix`` repairing only what is safe."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml

from tests.fakes import fake_telegram
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import ROOT, install_plugin


def doctor(cfg_path, *extra: str, stderr: list[str] | None = None,
           **env_extra: str) -> tuple[int, dict[str, list[dict]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "doctor", "--json", "--config",
                        str(cfg_path), "--unit-dir", str(cfg_path.parent / "units"), *extra],
                       capture_output=True, text=True, cwd=ROOT, env={**env, **env_extra},
                       timeout=120)
    assert r.stdout, r.stderr
    if stderr is not None:
        stderr.append(r.stderr)
    by: dict[str, list[dict]] = {}
    for f in json.loads(r.stdout):
        by.setdefault(f["check"], []).append(f)
    return r.returncode, by


def severities(by, check):
    return [f["severity"] for f in by[check]]


@pytest.fixture
def setup(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cfg = {"gateway": {"state_dir": str(state)}}
    path = tmp_path / "config.yaml"

    def write(**sections):
        path.write_text(yaml.safe_dump({**cfg, **sections}))
        return path
    write()
    return tmp_path, state, write


def test_healthy_setup_is_all_ok(setup):
    _, _, write = setup
    code, by = doctor(write())
    assert code == 0
    assert {f["severity"] for fs in by.values() for f in fs} == {"ok"}
    assert set(by) == {"config", "env_file", "permissions", "lock", "disk", "clock",
                       "provider", "plugin", "channel", "access", "tools", "timeline",
                       "transcripts", "state",
                       "outbox", "backup", "systemd"}


def test_config_check_reads_the_env_file(setup):
    _tmp, _state, write = setup
    path = write(models={"providers": {"o": {"api": "openai",
                                             "api_key": "${DOC_KEY}"}}})
    code, by = doctor(path)
    assert code == 1 and severities(by, "config") == ["error"]
    assert "DOC_KEY is not set" in by["config"][0]["message"]
    assert "--env-file" in by["config"][0]["fix"]


def test_env_file_mode_is_checked_and_fixed(setup):
    _, state, write = setup
    env = state / "tidegate.env"
    env.write_text("X=1\n")
    env.chmod(0o644)
    _code, by = doctor(write())
    assert severities(by, "env_file") == ["warning"] and "chmod 600" in by["env_file"][0]["fix"]
    _code, by = doctor(write(), "--fix")
    assert by["env_file"][0]["fixed"] and env.stat().st_mode & 0o777 == 0o600


def test_state_dir_permissions(setup):
    _, state, write = setup
    state.chmod(0o755)
    _code, by = doctor(write())
    assert severities(by, "permissions") == ["warning"]
    doctor(write(), "--fix")
    assert state.stat().st_mode & 0o777 == 0o700


def test_stale_gateway_json(setup):
    _, state, write = setup
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (state / "gateway.json").write_text(json.dumps({"pid": dead.pid, "port": 1}))
    _code, by = doctor(write())
    assert severities(by, "lock") == ["warning"] and "not running" in by["lock"][0]["message"]
    doctor(write(), "--fix")
    assert not (state / "gateway.json").exists()


def test_disk_space(setup, monkeypatch):
    from gateway.cli import doctor as d
    _, state, _ = setup
    assert d.check_disk({"state_dir": state, "disk_free": 50 << 20})[0].severity == "error"
    assert d.check_disk({"state_dir": state, "disk_free": 500 << 20})[0].severity == \
        "warning"
    assert d.check_disk({"state_dir": state})[0].severity in ("ok", "warning", "error")


def test_clock_before_the_installation_is_an_error(setup):
    from gateway.cli import doctor as d
    _, _state, _ = setup
    assert d.check_clock({"now": 0.0, "loaded": None})[0].severity == "error"
    assert d.check_clock({"loaded": None})[0].severity == "ok"


def test_provider_tiny_request(setup):
    _, _, write = setup
    fake = FakeOpenAI.start_in_thread(api_key="sk-right-0123456789")
    try:
        def cfg(key):
            return write(models={"providers": {"fake": {"api": "openai",
                                                         "base_url": fake.base_url,
                                                         "api_key": key}}, "retries": 0},
                         agents={"defaults": {"model": "fake/fake-model"}})
        code, by = doctor(cfg("sk-wrong-0123456789"))
        assert code == 1 and severities(by, "provider") == ["error"]
        assert "fake/fake-model" in by["provider"][0]["message"]
        assert "sk-wrong" not in json.dumps(by)  # secrets are not echoed
        fake.server.script_text("OK")
        code, by = doctor(cfg("sk-right-0123456789"))
        assert severities(by, "provider") == ["ok"]
        assert fake.server.requests[-1].json["max_tokens"] == 1
    finally:
        fake.stop()


def test_each_auth_profile_gets_its_own_tiny_request(setup):
    # a provider with auth_profiles only: each profile is probed with its own key
    _, _, write = setup
    fake = FakeOpenAI.start_in_thread(api_key="sk-right-0123456789")
    try:
        fake.server.script_text("OK")
        code, by = doctor(write(
            models={"providers": {"fake": {"api": "openai", "base_url": fake.base_url,
                                           "auth_profiles": [
                                               {"id": "work", "api_key": "sk-right-0123456789"},
                                               {"id": "old", "api_key": "sk-wrong-0123456789"},
                                               {"id": "ci", "api_key_env": "QA_NOT_SET_KEY"}]}},
                    "retries": 0},
            agents={"defaults": {"model": "fake/fake-model"}}))
        found = {f["message"].split(")")[0]: f for f in by["provider"]}
        assert code == 1 and severities(by, "provider") == ["ok", "error", "error"], by
        assert found["fake/fake-model (profile work"]["severity"] == "ok"
        assert "401" in found["fake/fake-model (profile old"]["message"]
        assert "QA_NOT_SET_KEY is not set" in found["fake/fake-model (profile ci"]["message"]
        assert "sk-wrong" not in json.dumps(by) and "sk-right" not in json.dumps(by)
    finally:
        fake.stop()


def test_a_plugin_that_fails_to_load_is_listed_with_its_error(setup):
    tmp, _, write = setup
    site = tmp / "site"
    site.mkdir()
    install_plugin(site, "tidegate-broken", "broken", "broken_channel",
                   "raise RuntimeError('cannot reach the license server')\n")
    err: list[str] = []
    code, by = doctor(write(channels={"broken": {"enabled": True}}), stderr=err,
                      PYTHONPATH=str(site))
    assert code == 1
    [found] = by["plugin"]
    assert (found["severity"], found["message"]) == ("error", (
        "channel plugin 'broken' (tidegate-broken 1.2.3) failed to load: RuntimeError: "
        "cannot reach the license server"))
    assert "tidegate-broken" in found["fix"] and "channels.broken" in found["fix"]
    assert "Traceback" not in err[0] and "plugin_load_failed" not in err[0]
    _code, by = doctor(write(), PYTHONPATH=str(site))  # installed, not configured
    assert severities(by, "plugin") == ["warning"]


def test_channel_token_is_checked_live(setup):
    _, _, write = setup
    tg = fake_telegram.start_in_thread()
    try:
        code, by = doctor(write(channels={"telegram": {
            "enabled": True, "token": "999:not-the-bot", "api_base_url": f"{tg.url}/bot"}}))
        assert code == 1 and severities(by, "channel") == ["error"]
        code, by = doctor(write(channels={"telegram": {
            "enabled": True, "token": fake_telegram.DEFAULT_TOKEN,
            "api_base_url": f"{tg.url}/bot"}}))
        assert severities(by, "channel") == ["ok"]
    finally:
        tg.stop()


def test_an_allowlist_without_senders_is_a_warning_naming_the_key(setup):
    """dm_policy allowlist with an empty allow_from answers nobody in DMs: a warning per
    such account, its fix naming the key; an account with senders is fine."""
    _, _, write = setup
    tg = fake_telegram.start_in_thread()
    try:
        code, by = doctor(write(channels={"telegram": {
            "enabled": True, "token": fake_telegram.DEFAULT_TOKEN,
            "api_base_url": f"{tg.url}/bot", "dm_policy": "allowlist",
            "accounts": {"a": {"allow_from": ["42"]}, "b": {}}}}))
    finally:
        tg.stop()
    assert code == 0 and by["access"] == [{
        "check": "access", "severity": "warning", "fixed": False,
        "message": "telegram:b: dm_policy allowlist with an empty allow_from: nobody gets "
                   "an answer in direct messages",
        "fix": "add the senders to channels.telegram.accounts.b.allow_from, or set "
               "channels.telegram.accounts.b.dm_policy to pairing"}]


def test_slack_and_discord_tokens_are_checked_live(setup):
    """A wrong Slack token (``auth.test``) and a wrong Discord token (``/users/@me``) are
    each a failing ``channel`` finding; the right ones are ok."""
    from tests.fakes import fake_discord, fake_slack
    _, _, write = setup
    sl, dc = fake_slack.start_in_thread(), fake_discord.start_in_thread()

    def channels(slack_token: str, discord_token: str) -> dict:
        return {"slack": {"enabled": True, "bot_token": slack_token,
                          "app_token": sl.fake.app_token,
                          "api_base_url": sl.api_url.rstrip("/")},
                "discord": {"enabled": True, "token": discord_token,
                            "api_base_url": dc.api_url}}
    try:
        code, by = doctor(write(channels=channels("xoxb-wrong", "wrong-discord")))
        assert code == 1 and severities(by, "channel") == ["error", "error"], by["channel"]
        text = " ".join(f["message"] for f in by["channel"])
        assert "slack" in text and "invalid_auth" in text, text
        assert "discord" in text and "401" in text, text
        assert all(f.get("fix") for f in by["channel"]), by["channel"]
        assert "wrong-discord" not in json.dumps(by)
        code, by = doctor(write(channels=channels(sl.fake.bot_token, dc.fake.token)))
        assert severities(by, "channel") == ["ok", "ok"], by["channel"]
    finally:
        dc.stop()
        sl.stop()


def test_timeline_that_is_not_a_database(setup):
    _, state, write = setup
    (state / "timeline.db").write_bytes(b"this is not sqlite" * 100)
    code, by = doctor(write())
    assert code == 1 and severities(by, "timeline") == ["error"]


def test_timeline_broken_chain_is_named(setup):
    _, state, write = setup
    db = state / "timeline.db"
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE timelines (session_id, session_key, status, created_at, "
                       "ended_at, last_seq, last_hash, last_timestamp);"
                       "CREATE TABLE timeline_events (event_id, session_id, seq, timestamp, "
                       "event_type, content, prev_hash, hash);"
                       "INSERT INTO timelines VALUES ('s1','agent:main:main','active',0,"
                       "NULL,1,'x',0);"
                       "INSERT INTO timeline_events VALUES ('e1','s1',1,0,'SESSION_CREATE',"
                       "'{}','0','bogus');")
    conn.commit()
    conn.close()
    code, by = doctor(write())
    assert code == 1 and severities(by, "timeline") == ["error"]
    assert "session s1" in by["timeline"][0]["message"]


async def test_timeline_events_still_in_the_pending_log_are_verified(setup):
    """A running gateway's group commit keeps a fresh install's events in
    ``timeline.db-pending`` for minutes: doctor reads that log alongside the database,
    so it reports (and verifies) the real number, not "0 most recent timelines"."""
    import asyncio

    from runtime.timeline import Timeline
    _, state, write = setup
    db = state / "timeline.db"
    tl = await Timeline.open_sqlite(db)
    try:
        for sid in ("s1", "s2"):
            await tl.init_timeline(sid, f"agent:main:telegram:dm:{sid}")
            await tl.append_events(sid, [("USER_INPUT", {"text": "hi"}, None),
                                         ("LLM_RESPONSE", {"text": "hello"}, None)])
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT count(*) FROM timeline_events").fetchone() == (0,)
        conn.close()
        assert (state / "timeline.db-pending").stat().st_size > 0
        code, by = await asyncio.to_thread(doctor, write())
    finally:
        await tl.close()
    assert code == 0
    assert [(f["severity"], f["message"]) for f in by["timeline"]] == [
        ("ok", "2 most recent timelines verified: 6 events")]


def test_torn_transcript_line(setup):
    _, state, write = setup
    sessions = state / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "abc.jsonl").write_text('{"type": "session"}\n{"type": "mess')
    _code, by = doctor(write())
    assert severities(by, "transcripts") == ["warning"]
    assert "abc.jsonl line 2" in by["transcripts"][0]["message"]


def test_corrupt_json_state_files_are_named(setup):
    _, state, write = setup
    (state / "cron").mkdir()
    (state / "cron" / "jobs.json").write_text('{"version": 1, "jobs": [')
    (state / "auth-state.json").write_text("[[[")
    code, by = doctor(write())
    assert code == 1 and severities(by, "state") == ["error", "error"], by
    cron, auth = by["state"]
    assert str(state / "cron" / "jobs.json") in cron["message"] and "cron" in cron["message"]
    assert str(state / "auth-state.json") in auth["message"]
    assert "move it away" in cron["fix"]
    (state / "cron" / "jobs.json").write_text('{"version": 1, "jobs": []}')
    (state / "auth-state.json").unlink()
    code, by = doctor(write())
    assert code == 0 and severities(by, "state") == ["ok"]


def test_outbox_backlog(setup):
    _, state, write = setup
    (state / "outbox").mkdir()
    (state / "outbox" / "1.json").write_text("{}")
    _code, by = doctor(write())
    assert severities(by, "outbox") == ["warning"] and "1 replies" in by["outbox"][0]["message"]


def test_systemd_unit_against_the_installed_binary(setup):
    tmp, _, write = setup
    units = tmp / "units"
    units.mkdir()
    (units / "tidegate.service").write_text("[Service]\nExecStart=/nonexistent/tidegate "
                                            "gateway\n")
    code, by = doctor(write())
    assert code == 1 and severities(by, "systemd") == ["error"]
    (units / "tidegate.service").write_text(f"[Service]\nExecStart={sys.executable} -m "
                                            "gateway.cli gateway\n")
    code, by = doctor(write())
    assert severities(by, "systemd") == ["ok"]


def _script(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\nimport sys\nfrom gateway.cli import main\n"
                    "sys.exit(main())\n")
    path.chmod(0o755)
    return path


def test_systemd_unit_of_this_script_run_by_a_relative_path(setup):
    """Run as ``bin/tidegate`` from the installation's directory (not on PATH, not next
    to the interpreter), doctor recognises the unit that names that script by its
    absolute path or through a symlink, and still warns about another installation."""
    tmp, _, write = setup
    inst = tmp / "inst"
    script = _script(inst / "bin" / "tidegate")
    (tmp / "link").mkdir()
    (tmp / "link" / "tidegate").symlink_to(script)
    other = _script(tmp / "other" / "bin" / "tidegate")
    units = tmp / "units"
    units.mkdir()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp)}
    results = {}
    for name, exe in (("absolute", script), ("symlink", tmp / "link" / "tidegate"),
                      ("other", other)):
        (units / "tidegate.service").write_text(f"[Service]\nExecStart={exe} gateway\n")
        r = subprocess.run(["bin/tidegate", "doctor", "--json", "--config", str(write()),
                            "--unit-dir", str(units)], cwd=inst, env=env,
                           capture_output=True, text=True, timeout=120)
        results[name] = [(f["severity"], f["message"]) for f in json.loads(r.stdout)
                         if f["check"] == "systemd"]
    unit = units / "tidegate.service"
    assert results["absolute"] == [("ok", f"{unit} runs this installation")]
    assert results["symlink"] == [("ok", f"{unit} runs this installation")]
    assert results["other"] == [("warning", f"{unit} runs {other}, not this installation")]


def test_unknown_tool_entries_and_broken_skills_are_reported(setup):
    _tmp, state, write = setup
    bad = state / "workspace" / "main" / "skills" / "broken" / "SKILL.md"
    bad.parent.mkdir(parents=True)
    bad.write_text("no front matter here")
    code, by = doctor(write(tools={"deny": ["nonsense_tool"]}))
    assert code == 0  # warnings: the gateway runs without those entries
    lines = [f["message"] for f in by["tools"]]
    assert severities(by, "tools") == ["warning", "warning"]
    assert any("'nonsense_tool' matches no known tool" in m for m in lines)
    assert any("agent main skill" in m and "broken/SKILL.md" in m for m in lines)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_webhooks_are_checked_at_the_platform_and_on_the_wire(setup):
    """Telegram webhook mode: registered URL (getWebhookInfo at the fake), Telegram's own
    delivery errors, and a probe with a wrong secret that the gateway must refuse; Slack
    HTTP mode: the unsigned probe; polling with a webhook set: a warning."""
    from tests.fakes import fake_slack
    from tests.helpers import GatewayProcess
    tmp, state, write = setup
    tg, sl = fake_telegram.start_in_thread(), fake_slack.start_in_thread()
    port = free_port()
    hook = f"http://127.0.0.1:{port}/telegram/webhook"
    channels = {
        "telegram": {"enabled": True, "token": fake_telegram.DEFAULT_TOKEN,
                     "api_base_url": f"{tg.url}/bot", "mode": "webhook",
                     "webhook_secret": "hook-Secret_1", "webhook_url": hook},
        "slack": {"enabled": True, "bot_token": sl.fake.bot_token, "mode": "http",
                  "signing_secret": "slack-signing-secret",
                  "api_base_url": sl.fake.api_url.rstrip("/")}}
    cfg = {"gateway": {"state_dir": str(state), "port": port,
                       "public_base_url": f"http://127.0.0.1:{port}"},
           "channels": channels}
    try:
        gw = GatewayProcess(tmp, cfg).start()  # registers webhook_url with setWebhook
        try:
            code, by = doctor(gw.config_path)
            hooks = {f["message"]: f["severity"] for f in by["webhook"]}
            assert hooks == {
                f"telegram: registered with Telegram at {hook}": "ok",
                f"telegram: {hook} answers and refuses a request with a wrong signature": "ok",
                f"slack: http://127.0.0.1:{port}/slack/events answers and refuses a request "
                "with a wrong signature": "ok"}, hooks
            # another deployment re-registers the bot's webhook elsewhere
            tg.call(tg.fake._m_setwebhook, {"url": "https://elsewhere.example/hook"})
            code, by = doctor(gw.config_path)
            [wrong] = [f for f in by["webhook"] if "delivers to" in f["message"]]
            assert code == 1 and wrong["severity"] == "error"
            assert "https://elsewhere.example/hook, not " + hook in wrong["message"]
            assert "hook-Secret_1" not in json.dumps(by)
            tg.call(tg.fake._m_setwebhook, {"url": hook, "secret_token": "hook-Secret_1"})
        finally:
            gw.stop()
        # the gateway is down: Telegram cannot deliver, and the probe finds nobody
        tg.call(tg.fake.inject_message, "anyone there?", chat_id=5, user_id=5)
        deadline = time.monotonic() + 10
        while not tg.fake.webhook.get("last_error") and time.monotonic() < deadline:
            time.sleep(0.05)
        code, by = doctor(gw.config_path)
        sev = {f["message"].split(":")[0] + ":" + f["severity"] for f in by["webhook"]}
        assert code == 1
        assert any(f["severity"] == "warning" and "last delivery failed" in f["message"]
                   and "Connection refused" in f["message"] for f in by["webhook"]), sev
        assert any(f["severity"] == "error" and f"{hook} is not reachable" in f["message"]
                   for f in by["webhook"])
        # polling while a webhook is registered
        channels["telegram"] = {"enabled": True, "token": fake_telegram.DEFAULT_TOKEN,
                                "api_base_url": f"{tg.url}/bot"}
        del channels["slack"]
        code, by = doctor(write(channels=channels))
        [f] = by["webhook"]
        assert f["severity"] == "warning" and "while this account polls" in f["message"]
    finally:
        tg.stop()
        sl.stop()
