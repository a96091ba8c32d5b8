"""``tidegate config validate`` catches bad credential config and small context windows;
``tidegate models status [--json]`` shows providers, profiles and chains (issue 10)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from gateway.cli.main import main
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway


def last_json(out: str) -> dict:
    """The CLI's JSON document (in-process gateway log lines may precede it)."""
    return json.loads(out[out.rindex("\n{\n") + 1:] if not out.startswith("{\n") else out)


def write(tmp_path, providers: dict, model="p/m", **defaults) -> str:
    cfg = base_config(tmp_path / "state")
    cfg["models"] = {"providers": providers}
    cfg["agents"] = {"defaults": {"model": model, **defaults}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.parametrize("profiles,expected", [
    ([{"id": "a"}], "models.providers.p.auth_profiles.0: profile 'a' has no key"),
    ([{"id": "a", "api_key": "k1"}, {"id": "a", "api_key": "k2"}],
     "models.providers.p.auth_profiles.1.id: duplicate profile id 'a'"),
    ([{"id": "a", "api_key_env": "TIDEGATE_TEST_SURELY_UNSET"}],
     "models.providers.p.auth_profiles.0.api_key_env: TIDEGATE_TEST_SURELY_UNSET is not set"),
])
def test_config_validate_names_bad_credentials(tmp_path, capsys, profiles, expected):
    path = write(tmp_path, {"p": {"api": "openai", "auth_profiles": profiles}})
    assert main(["--config", path, "config", "validate"]) == 2
    err = capsys.readouterr().err
    assert expected in err and "k1" not in err and "k2" not in err


def test_config_validate_reports_the_context_window_guard(tmp_path, capsys):
    providers = {"p": {"api": "openai", "api_key": "k",
                       "models": {"tiny": {"context_window": 8000},
                                  "small": {"context_window": 20000}}}}
    assert main(["--config", write(tmp_path, providers, "p/tiny"), "config", "validate"]) == 2
    err = capsys.readouterr().err
    assert ("model p/tiny has a context window of 8,000 tokens, below "
            "agents.defaults.context_guard.min (16,000)") in err
    assert main(["--config", write(tmp_path, providers, "p/small"), "config", "validate"]) == 0
    captured = capsys.readouterr()
    assert "warning: agents.defaults.model: model p/small" in captured.err
    assert "context_guard.warn_below (32,000)" in captured.err and "config OK" in captured.out
    gpt4 = {"p": {"api": "openai", "api_key": "k"}}
    assert main(["--config", write(tmp_path, gpt4, "p/gpt-4"), "config", "validate"]) == 2
    assert "8,192 tokens" in capsys.readouterr().err  # the built-in table


async def test_the_guard_refuses_an_8k_model_with_a_clear_error(tmp_path):
    async with FakeOpenAI() as fake:
        cfg = base_config(tmp_path / "state", fake.base_url)
        cfg["models"]["providers"]["fake"]["models"] = {"tiny": {"context_window": 8000}}
        cfg["agents"] = {"defaults": {"model": "fake/tiny"}}
        async with running_gateway(cfg) as gw:
            r = await gw.local.send("hello")
            assert any("agent main: model fake/tiny" in p for p in gw.status()["problems"])
    assert r.status == "error" and not fake.requests
    assert "fake/tiny" in r.error and "agents.defaults.context_guard.min" in r.error
    assert "too small a context window" in r.text


async def test_models_status_from_the_gateway_and_from_the_state_file(tmp_path, capsys):
    async with FakeOpenAI(api_key="key-b-000000") as fake:
        providers = {"p": {"api": "openai", "base_url": fake.base_url, "auth_profiles": [
            {"id": "a", "api_key": "key-a-000000"}, {"id": "b", "api_key": "key-b-000000"}]}}
        path = write(tmp_path, providers, {"primary": "p/m", "fallbacks": ["echo/x"]})
        async with running_gateway(yaml.safe_load(Path(path).read_text())) as gw:
            await gw.local.send("hi")
            assert await asyncio.to_thread(main, ["--config", path, "models", "status",
                                                  "--json"]) == 0
            live = last_json(capsys.readouterr().out)
        assert live["source"] == "gateway"
        assert live["chains"]["main"]["last_answer"]["profile"] == "b"
        assert main(["--config", path, "models", "status", "--json"]) == 0
        offline = last_json(capsys.readouterr().out)
    assert offline["source"] == "state file"
    for report in (live, offline):
        rows = {p["id"]: p for p in report["providers"]["p"]["profiles"]}
        assert rows["a"]["last_error_class"] == "auth" and rows["b"]["state"] == "ok"
        assert report["providers"]["p"]["last_good"] == "b"
        assert report["chains"]["main"]["fallbacks"] == ["echo/x"]
    assert rows["a"]["state"] == "cooling"  # offline: the real clock, a's hour not over
    assert main(["--config", path, "models", "status"]) == 0
    text = capsys.readouterr().out
    assert "profile a [api_key]: cooling" in text and "key-a" not in text
    assert "agent main: primary p/m, fallbacks echo/x; would use p/m (profile b)" in text


def test_offline_models_status_with_a_corrupt_auth_state_is_not_healthy(tmp_path, capsys):
    providers = {"p": {"api": "openai", "base_url": "http://127.0.0.1:9/v1",
                       "auth_profiles": [{"id": "a", "api_key": "key-a-000000"}]}}
    path = write(tmp_path, providers)
    state = tmp_path / "state"
    state.mkdir(parents=True, exist_ok=True)
    (state / "auth-state.json").write_text("{not json")
    assert main(["--config", path, "models", "status"]) == 1
    out = capsys.readouterr().out
    assert "problem: auth state file" in out and "is corrupt" in out
    assert "profile a [api_key]: unknown" in out and ": ok" not in out
    assert "would use unknown" in out
    assert main(["--config", path, "models", "status", "--json"]) == 1
    report = last_json(capsys.readouterr().out)
    assert report["problems"] and report["persistence"] == "disabled"
    assert report["providers"]["p"]["profiles"][0]["state"] == "unknown"
    assert (state / "auth-state.json").read_text() == "{not json"  # left for the operator


async def test_models_reset_puts_a_benched_profile_back_in_service(tmp_path, capsys):
    """After a 402 the profile rests for hours; topping up credits had no way back."""
    async with FakeOpenAI() as fake:
        providers = {"p": {"api": "openai", "base_url": fake.base_url, "auth_profiles": [
            {"id": "a", "api_key": "key-a-000000"}]}}
        path = write(tmp_path, providers, "p/m")
        async with running_gateway(yaml.safe_load(Path(path).read_text())) as gw:
            fake.script_error(402, message="insufficient credit", error_type="billing")
            assert (await gw.local.send("hi")).status == "error"
            assert gw.auth_profiles.cooling("p", "a") > 3600  # benched for hours
            assert await asyncio.to_thread(main, ["--config", path, "models", "reset",
                                                  "p/a"]) == 0
            assert "reset p/a: back in service" in capsys.readouterr().out
            assert gw.auth_profiles.cooling("p", "a") == 0
            fake.script_text("thanks for the credits")
            assert (await gw.local.send("again")).text == "thanks for the credits"
            assert await asyncio.to_thread(main, ["--config", path, "models", "reset",
                                                  "q/zz"]) == 1
            assert "no auth profile 'q/zz' (known: p/a)" in capsys.readouterr().err
    state = json.loads((tmp_path / "state" / "auth-state.json").read_text())
    assert state["providers"]["p"]["profiles"]["a"]["cooldown_until"] is None
    # without the gateway: the state file itself
    state["providers"]["p"]["profiles"]["a"]["cooldown_until"] = 4_000_000_000.0
    (tmp_path / "state" / "auth-state.json").write_text(json.dumps(state))
    assert main(["--config", path, "models", "reset", "a"]) == 0
    after = json.loads((tmp_path / "state" / "auth-state.json").read_text())
    assert after["providers"]["p"]["profiles"]["a"]["cooldown_until"] is None
