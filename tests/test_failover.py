"""Issue 10: the agent keeps going when providers fail — error classes, auth profiles,
cooldowns, fallbacks, proactive token refresh, state across restarts. Everything runs
through the whole in-process gateway against the fake OpenAI and Anthropic servers with
injected faults, on the fake clock (waits are asserted, never slept)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import runtime.providers.anthropic_provider
import runtime.providers.openai_provider  # noqa: F401
from runtime.clock import FakeClock, utc_iso
from runtime.providers.failover.errors import user_notice
from tests.fakes.fake_anthropic import FakeAnthropic
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway

T0 = 1_767_225_600.0


def provider(fake, **extra) -> dict:
    api = "anthropic" if isinstance(fake, FakeAnthropic) else "openai"
    return {"api": api, "base_url": fake.base_url, **extra}


def config(tmp_path: Path, providers: dict, model, **models) -> dict:
    cfg = base_config(tmp_path / "state")
    cfg["models"] = {"providers": providers, "retries": 2, "retry_backoff": "1s", **models}
    cfg["agents"] = {"defaults": {"model": model}}
    return cfg


async def wait_for_sleeper(clock: FakeClock, seconds: float, timeout: float = 60.0) -> None:
    """Wait (real time, polling) until something sleeps ``seconds`` on the fake clock."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if any(abs(d - clock.monotonic() - seconds) < 0.01 for d, _, f in clock._sleepers
               if not f.done()):
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"nothing sleeps {seconds}s on the fake clock")


def live_in_group(pgid: int) -> list[int]:
    """Pids of running (not zombie) processes in process group ``pgid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def attempts(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"] == "model_attempt"]


def no_tracebacks(logs: list[dict]) -> None:
    assert not [e for e in logs if e.get("exc_info") or e.get("exception")], logs


@pytest.mark.parametrize("fake_cls,headers", [
    (FakeOpenAI, None),
    (FakeAnthropic, {"anthropic-ratelimit-requests-remaining": "0",
                     "anthropic-ratelimit-requests-reset": utc_iso(T0 + 2)}),
])
async def test_429_with_a_short_wait_is_retried_once_after_the_wait(tmp_path, fake_cls, headers):
    clock = FakeClock(T0)
    async with fake_cls() as fake:
        cfg = config(tmp_path, {"p": provider(fake, api_key="sk-test-0123456789")}, "p/m")
        async with running_gateway(cfg, clock=clock) as gw:
            if headers:
                fake.script_error(429, headers=headers)
            else:
                fake.script_error(429, retry_after=2)
            fake.script_text("after the wait")
            with capture_logs() as logs:
                sub = gw.local.submit("hello")
                await wait_for_sleeper(clock, 2.0)
                assert len(fake.requests) == 1 and not sub.future.done()
                await clock.advance(2.0)
                result = await sub.future
    assert result.status == "ok" and result.text == "after the wait"
    assert len(fake.requests) == 2
    first, second = attempts(logs)
    assert (first["class"], first["decision"], first["wait_ms"], first["status"]) == (
        "rate_limit", "retry", 2000, 429)
    assert first["profile"] == "default" and first["provider"] == "p" and first["run_id"]
    assert "sk-test-0123456789" not in json.dumps(logs)
    assert (second["decision"], second["log_level"]) == ("return", "info")  # after a failure


async def test_an_answer_at_the_first_attempt_logs_its_attempt_at_debug_only(tmp_path):
    """Issue 9 "Disk": at the default level a plain turn writes one log line (turn_done),
    not a model_attempt line as well; an answer after a failure stays at info (above)."""
    async with FakeOpenAI() as fake:
        cfg = config(tmp_path, {"p": provider(fake, api_key="sk-test-0123456789")}, "p/m")
        async with running_gateway(cfg, clock=FakeClock(T0)) as gw:
            fake.script_text("at once")
            with capture_logs() as logs:
                result = await gw.local.send("hello")
    assert result.text == "at once"
    [attempt] = attempts(logs)
    assert (attempt["decision"], attempt["log_level"]) == ("return", "debug")
    above_debug = [e["event"] for e in logs if e["log_level"] != "debug"]
    assert "turn_done" in above_debug and "model_attempt" not in above_debug
    no_tracebacks(logs)


@pytest.mark.parametrize("fake_cls", [FakeOpenAI, FakeAnthropic])
async def test_401_rotates_to_the_next_profile_and_the_cooled_profile_is_tried_again(tmp_path,
                                                                                     fake_cls):
    clock = FakeClock(T0)
    async with fake_cls(api_key={"key-b-000000"}) as fake:
        profiles = [{"id": "a", "api_key": "key-a-000000"}, {"id": "b", "api_key": "key-b-000000"}]
        cfg = config(tmp_path, {"p": provider(fake, auth_profiles=profiles)}, "p/m")
        async with running_gateway(cfg, clock=clock) as gw:
            with capture_logs() as logs:
                r1 = await gw.local.send("one")
            assert r1.status == "ok" and r1.profile == "b"
            assert fake.presented_keys() == ["key-a-000000", "key-b-000000"]
            a = attempts(logs)[0]
            assert (a["class"], a["decision"], a["profile"]) == ("auth", "rotate", "a")
            rows = {p["id"]: p for p in gw.models_status()["providers"]["p"]["profiles"]}
            assert rows["a"]["state"] == "cooling" and rows["a"]["cooldown_left_s"] == 3600
            assert rows["a"]["last_error_class"] == "auth" and rows["b"]["state"] == "ok"
            assert any("profile a" in p for p in gw.status()["problems"])
            await gw.local.send("two")  # last_good first: a is not touched while cooling
            assert fake.presented_keys()[2:] == ["key-b-000000"]

            await clock.advance(3601)
            fake.api_key = {"key-a-000000"}  # b revoked, a fixed: a must be tried again
            r3 = await gw.local.send("three")
            assert r3.status == "ok" and r3.profile == "a"
            assert fake.presented_keys()[3:] == ["key-b-000000", "key-a-000000"]
            assert not any("profile a" in p for p in gw.status()["problems"])
    no_tracebacks(logs)


async def test_every_primary_profile_failing_hands_over_to_the_fallback_model(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI(api_key="nobody-has-this") as primary, FakeAnthropic() as backup:
        profiles = [{"id": "a", "api_key": "key-a-000000"}, {"id": "b", "api_key": "key-b-000000"}]
        cfg = config(tmp_path, {"p": provider(primary, auth_profiles=profiles),
                                "bk": provider(backup, api_key="sk-ant-backup-000")},
                     {"primary": "p/m", "fallbacks": ["bk/claude-fallback"]})
        async with running_gateway(cfg, clock=clock) as gw:
            from gateway.agents import session_sees_images

            key = "agent:main:cli:dm:local"  # intake encodes images ahead for this model:
            assert not session_sees_images(gw.agents, "main", key)  # p/m: text-only
            backup.script_text("the fallback answered")
            with capture_logs() as logs:
                r = await gw.local.send("hi")
            assert r.status == "ok" and r.text == "the fallback answered"
            assert (r.provider, r.model, r.profile) == ("bk", "claude-fallback", "default")
            assert len(primary.requests) == 2
            assert any(e["event"] == "model_failover" for e in logs)
            await gw.timeline_hooks.flush()
            events = await gw.timeline_hooks.timeline.get_timeline(r.session_id)
            llm = [e.content for e in events if e.event_type == "LLM_RESPONSE"][-1]
            assert (llm["provider"], llm["model"], llm["profile"]) == (
                "bk", "claude-fallback", "default")
            chain = gw.status()["models"]["chains"]["main"]
            assert chain["last_answer"]["model"] == "bk/claude-fallback"
            assert chain["would_use"] == {"model": "bk/claude-fallback", "profile": "default"}
            assert session_sees_images(gw.agents, "main", key)  # after failover: Claude
            assert "fallback" not in r.text.replace("the fallback answered", "")
            await gw.local.send("again")  # both primary profiles cool down: no new requests
            assert len(primary.requests) == 2
    no_tracebacks(logs)


@pytest.mark.parametrize("fake_cls,status,message", [
    (FakeOpenAI, 402, None),
    (FakeOpenAI, 429, "You exceeded your current quota (insufficient_quota)"),
    (FakeAnthropic, 400, "Your credit balance is too low to access the Anthropic API."),
])
async def test_billing_gives_one_plain_notice_and_no_retry_storm(tmp_path, fake_cls, status,
                                                                 message):
    clock = FakeClock(T0)
    async with fake_cls() as fake:
        cfg = config(tmp_path, {"p": provider(fake, api_key="sk-secret-billing-01")}, "p/m")
        async with running_gateway(cfg, clock=clock) as gw:
            fake.script_error(status, message=message, error_type="invalid_request_error"
                              if fake_cls is FakeAnthropic else None)
            with capture_logs() as logs:
                r1 = await gw.local.send("hello")
                r2 = await gw.local.send("hello again")
            assert len(fake.requests) == 1  # billing: never retried, the profile rests
            notice = user_notice("billing")
            assert r1.text == notice == r2.text and r1.status == "error"
            assert "quota is used up" in notice
            assert "credit" not in r1.text and "insufficient" not in r1.text
            assert any("profile default: cooling down 5h00m after billing" in p
                       for p in gw.status()["problems"])
            assert "5h" in gw.status_text("main", r1.session_key)
    a = attempts(logs)
    assert (a[0]["class"], a[0]["decision"]) == ("billing", "rotate")
    assert (a[1]["decision"], a[1]["status"]) == ("skip", "cooling")
    no_tracebacks(logs)


async def test_rate_limit_longer_than_max_retry_wait_cools_down_and_tells_the_wait(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = config(tmp_path, {"p": provider(fake, api_key="sk-test-0123456789")}, "p/m")
        async with running_gateway(cfg, clock=clock) as gw:
            fake.script_error(429, retry_after=600)
            r = await gw.local.send("hi")
            assert len(fake.requests) == 1
            assert r.text == user_notice("rate_limit", 600) and "10 minutes" in r.text
            await clock.advance(601)
            r2 = await gw.local.send("hi again")  # half-open: tried again, answers
            assert r2.status == "ok" and len(fake.requests) == 2


async def test_transient_errors_retry_with_backoff_then_rotate(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        profiles = [{"id": "a", "api_key": "key-a-000000"}, {"id": "b", "api_key": "key-b-000000"}]
        cfg = config(tmp_path, {"p": provider(fake, auth_profiles=profiles)}, "p/m",
                     retries=1)
        async with running_gateway(cfg, clock=clock) as gw:
            fake.script_error(503)
            fake.script_error(500)
            fake.script_text("b answers")
            with capture_logs() as logs:
                sub = gw.local.submit("hi")
                while len(fake.requests) < 1:
                    await asyncio.sleep(0.005)
                await clock.advance(1.0)  # backoff <= 1 s (base 1 s with jitter)
                r = await sub.future
            assert r.text == "b answers" and r.profile == "b"
            assert fake.presented_keys() == ["key-a-000000", "key-a-000000", "key-b-000000"]
            decisions = [(e["profile"], e["class"], e["decision"]) for e in attempts(logs)]
            assert decisions == [("a", "transient", "retry"), ("a", "transient", "rotate"),
                                 ("b", None, "return")]
            assert 500 <= attempts(logs)[0]["wait_ms"] <= 1000
    no_tracebacks(logs)


async def test_invalid_request_stops_without_retry_and_logs_the_providers_message(tmp_path):
    async with FakeOpenAI() as fake:
        cfg = config(tmp_path, {"p": provider(fake, api_key="sk-test-0123456789")}, "p/m")
        async with running_gateway(cfg, clock=FakeClock(T0)) as gw:
            fake.script_error(400, message="Invalid schema for function 'read'")
            with capture_logs() as logs:
                r = await gw.local.send("hi")
    assert len(fake.requests) == 1 and r.status == "error"
    assert r.text == user_notice("invalid_request") and "schema" not in r.text
    a = attempts(logs)[0]
    assert (a["class"], a["decision"]) == ("invalid_request", "stop")
    assert "Invalid schema for function" in a["error"]
    no_tracebacks(logs)


async def test_max_attempts_caps_one_turn(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = config(tmp_path, {"p": provider(fake, api_key="sk-test-0123456789")}, "p/m",
                     retries=10, max_attempts=3)
        async with running_gateway(cfg, clock=clock) as gw:
            for _ in range(5):
                fake.script_error(429, retry_after=0)
            r = await gw.local.send("hi")
    assert len(fake.requests) == 3 and r.text == user_notice("attempts")


async def test_context_overflow_compacts_the_session_and_retries_once(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = config(tmp_path, {"p": provider(fake, api_key="sk-test-0123456789")}, "p/m")
        async with running_gateway(cfg, clock=clock) as gw:
            for i in range(4):
                fake.script_text(f"answer {i} " + "x" * 200)
                await gw.local.send(f"question {i} " + "y" * 200)
            fake.script_error(400, message="This model's maximum context length is 8192 "
                              "tokens. However, your messages resulted in 9000 tokens.",
                              error_type="invalid_request_error")
            fake.script_text("SUMMARY: four questions were asked")
            fake.script_text("fits now")
            with capture_logs() as logs:
                r = await gw.local.send("one more")
            assert r.status == "ok" and r.text == "fits now"
            overflow = [e for e in logs if e["event"] == "context_overflow"]
            assert len(overflow) == 1 and len(overflow[0]["diag_id"]) == 8
            final = fake.requests[-1].json["messages"]
            assert any("SUMMARY: four questions" in str(m.get("content")) for m in final)
            transcript = gw.state_dir / "agents" / "main" / "sessions" / f"{r.session_id}.jsonl"
            kinds = [json.loads(line)["type"] for line in transcript.read_text().splitlines()]
            assert "compaction" in kinds
    no_tracebacks(logs)


TOKEN_SCRIPT = """\
import json, pathlib, sys
counter = pathlib.Path(sys.argv[1])
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
print("fetching token", file=sys.stderr)
print(json.dumps({"token": f"tok-{n}-abcdef", "expires_in": 3600}))
"""


async def test_api_key_command_is_refreshed_before_expiry_and_after_an_auth_error(tmp_path):
    clock = FakeClock(T0)
    script = tmp_path / "token.py"
    script.write_text(TOKEN_SCRIPT)
    counter = tmp_path / "count"
    command = f"{sys.executable} {script} {counter}"
    async with FakeOpenAI(api_key={"tok-1-abcdef", "tok-2-abcdef"}) as fake:
        profiles = [{"id": "copilot", "api_key_command": command}]
        cfg = config(tmp_path, {"p": provider(fake, auth_profiles=profiles)}, "p/m")
        async with running_gateway(cfg, clock=clock) as gw:
            with capture_logs() as logs:
                assert (await gw.local.send("one")).status == "ok"
                await clock.advance(1800)
                assert (await gw.local.send("two")).status == "ok"  # still cached
                assert fake.presented_keys() == ["tok-1-abcdef"] * 2
                await clock.advance(3600 - 1800 - 300 + 1)  # 5 min before expiry
                assert (await gw.local.send("three")).status == "ok"
                assert fake.presented_keys()[2] == "tok-2-abcdef"
                assert not [r for r in fake.requests if r.json is None]
                fake.api_key = {"tok-3-abcdef"}  # the token is revoked early
                r = await gw.local.send("four")
                assert r.status == "ok" and r.profile == "copilot"
                assert fake.presented_keys()[3:] == ["tok-2-abcdef", "tok-3-abcdef"]
            decisions = [e["decision"] for e in attempts(logs)]
            assert decisions[-2:] == ["refresh", "return"]
            assert counter.read_text() == "3"
            assert "tok-" not in json.dumps(logs) and "fetching token" not in json.dumps(logs)
            row = gw.models_status()["providers"]["p"]["profiles"][0]
            assert row["state"] == "ok" and row["token_expires_in_s"] == 3600
    no_tracebacks(logs)


async def test_a_failing_api_key_command_or_unset_env_moves_to_the_next_profile(tmp_path):
    async with FakeOpenAI(api_key="key-c-000000") as fake:
        profiles = [{"id": "cmd", "api_key_command": "echo oops-secret >&2; exit 3"},
                    {"id": "env", "api_key_env": "TIDEGATE_TEST_UNSET_KEY"},
                    {"id": "c", "api_key": "key-c-000000"}]
        cfg = config(tmp_path, {"p": provider(fake, auth_profiles=profiles)}, "p/m")
        async with running_gateway(cfg, clock=FakeClock(T0)) as gw:
            with capture_logs() as logs:
                r = await gw.local.send("hi")
    assert r.status == "ok" and r.profile == "c" and fake.presented_keys() == ["key-c-000000"]
    failed = [e for e in attempts(logs) if e["status"] == "credential"]
    assert [e["profile"] for e in failed] == ["cmd", "env"]
    assert "exited with 3" in failed[0]["error"] and "oops-secret" not in json.dumps(logs)
    assert "TIDEGATE_TEST_UNSET_KEY is not set" in failed[1]["error"]


async def test_profile_state_survives_a_restart_and_a_corrupt_file_disables_only_itself(
        tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI(api_key="key-b-000000") as fake:
        profiles = [{"id": "a", "api_key": "key-a-000000"}, {"id": "b", "api_key": "key-b-000000"}]
        cfg = config(tmp_path, {"p": provider(fake, auth_profiles=profiles)}, "p/m")
        async with running_gateway(cfg, clock=clock) as gw:
            await gw.local.send("one")
        state_file = tmp_path / "state" / "auth-state.json"
        saved = json.loads(state_file.read_text())["providers"]["p"]
        assert saved["last_good"] == "b"
        assert saved["profiles"]["a"]["cooldown_class"] == "auth"
        assert saved["profiles"]["a"]["cooldown_until"] == pytest.approx(T0 + 3600, abs=5)
        assert "key-a" not in state_file.read_text()

        async with running_gateway(cfg, clock=clock) as gw:  # restart: a still cooling
            await gw.local.send("two")
            assert fake.presented_keys()[2:] == ["key-b-000000"]

        state_file.write_text("{not json")
        with capture_logs() as logs:
            async with running_gateway(cfg, clock=clock) as gw:
                r = await gw.local.send("three")
                assert r.status == "ok"
                problems = gw.status()["problems"]
                assert gw.models_status()["persistence"] == "disabled"
        err = [e for e in logs if e["event"] == "auth_state_corrupt"]
        assert err and err[0]["log_level"] == "error" and err[0]["path"] == str(state_file)
        assert any(str(state_file) in p for p in problems)
        assert state_file.read_text() == "{not json"  # left for the operator


async def test_auth_state_persistence_resumes_once_the_corrupt_file_is_removed(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI(api_key="key-b-000000") as fake:
        profiles = [{"id": "a", "api_key": "key-a-000000"}, {"id": "b", "api_key": "key-b-000000"}]
        cfg = config(tmp_path, {"p": provider(fake, auth_profiles=profiles)}, "p/m")
        state_file = tmp_path / "state" / "auth-state.json"
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text("{not json")
        with capture_logs() as logs:
            async with running_gateway(cfg, clock=clock) as gw:
                await gw.local.send("one")  # a fails (auth) and cools down, in memory only
                assert state_file.read_text() == "{not json"
                state_file.unlink()  # the operator's fix, while the gateway runs
                assert gw.models_status()["persistence"] == "file"
                assert not any("auth-state" in p for p in gw.status()["problems"])
                saved = json.loads(state_file.read_text())["providers"]["p"]
                assert saved["profiles"]["a"]["cooldown_class"] == "auth"  # memory kept
                fake.script_error(401)
                await gw.local.send("two")  # b rejected too: that is written as well
                saved = json.loads(state_file.read_text())["providers"]["p"]
                assert saved["profiles"]["b"]["errors"] == {"auth": 1}
    assert any(e["event"] == "auth_state_resumed" for e in logs)


async def test_mixed_cooldowns_tell_the_rate_limit_wait_not_auth(tmp_path):
    """Profile a is benched for auth (an hour), b only rate-limited (10 minutes): b comes
    back by itself, so the notice is the wait, in the turn that benched them and after."""
    clock = FakeClock(T0)
    async with FakeOpenAI(api_key="key-b-000000") as fake:
        profiles = [{"id": "a", "api_key": "key-a-000000"}, {"id": "b", "api_key": "key-b-000000"}]
        cfg = config(tmp_path, {"p": provider(fake, auth_profiles=profiles)}, "p/m")
        async with running_gateway(cfg, clock=clock) as gw:
            fake.script_error(429, retry_after=600)
            r = await gw.local.send("one")  # a: 401 (rotate), b: 429 for 10 min (rotate)
            assert len(fake.requests) == 2
            assert r.text == user_notice("rate_limit", 600)
            await clock.advance(60)
            r = await gw.local.send("two")  # both cooling: nothing is sent
            assert len(fake.requests) == 2
            assert r.text == user_notice("rate_limit", 540) and "9 minutes" in r.text


async def test_a_wait_past_the_turn_deadline_is_not_taken(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = config(tmp_path, {"p": provider(fake, api_key="sk-test-0123456789")}, "p/m")
        cfg["agents"]["defaults"]["timeout"] = "30s"
        async with running_gateway(cfg, clock=clock) as gw:
            fake.script_error(429, retry_after=45)  # short enough for max_retry_wait (60 s)
            with capture_logs() as logs:
                r = await gw.local.send("hi")
    assert len(fake.requests) == 1 and r.text == user_notice("rate_limit", 60)
    assert attempts(logs)[0]["decision"] == "rotate"


def test_api_key_command_output_forms():
    from runtime.providers.failover.credentials import CredentialError, parse_token
    assert parse_token("tok-abc\n", T0, "x") == ("tok-abc", None)
    assert parse_token('{"token": "t", "expires_at": 1767229200}', T0, "x") == ("t", T0 + 3600)
    assert parse_token('{"token": "t", "expires_at": "2026-01-01T01:00:00Z"}', T0, "x") == (
        "t", T0 + 3600)
    assert parse_token('{"token": "t", "expires_in": 60}', T0, "x") == ("t", T0 + 60)
    for bad in ("", "  \n", '{"expires_in": 5}', '{"token": "t", "expires_at": "soon"}'):
        with pytest.raises(CredentialError):
            parse_token(bad, T0, "x")


async def test_an_api_key_command_that_hangs_is_killed_after_10s(tmp_path):
    clock = FakeClock(T0)
    pidfile = tmp_path / "cmd.pid"
    async with FakeOpenAI(api_key="key-b-000000") as fake:
        profiles = [{"id": "slow", "api_key_command": f"echo $$ > {pidfile}; sleep 30; echo t"},
                    {"id": "b", "api_key": "key-b-000000"}]
        cfg = config(tmp_path, {"p": provider(fake, auth_profiles=profiles)}, "p/m")
        async with running_gateway(cfg, clock=clock) as gw:
            with capture_logs() as logs:
                sub = gw.local.submit("hi")
                await wait_for_sleeper(clock, 10.0)
                await clock.advance(10.0)
                r = await sub.future
    assert r.status == "ok" and r.profile == "b"
    assert not live_in_group(int(pidfile.read_text()))  # the shell and its sleep are gone
    [failed] = [e for e in attempts(logs) if e["status"] == "credential"]
    assert failed["profile"] == "slow" and "timed out after 10s" in failed["error"]


async def test_a_402_then_500s_on_another_profile_is_not_called_quota_used_up(tmp_path):
    """Profile a has no credits, profile b answers 500 twice: the quota is not used up
    (b has quota), the provider is having trouble."""
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = config(tmp_path, {"p": provider(fake, auth_profiles=[
            {"id": "a", "api_key": "sk-a-0000000000"}, {"id": "b", "api_key": "sk-b-0000000000"}])},
            "p/m", retries=1, retry_backoff="0s")
        async with running_gateway(cfg, clock=clock) as gw:
            fake.script_error(402)
            fake.script_error(500)
            fake.script_error(500)
            r = await gw.local.send("hello")
        assert len(fake.requests) == 3
        assert r.status == "error" and r.text == user_notice("transient")
        assert "quota" not in r.text
