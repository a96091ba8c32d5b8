"""Issue 8 items 12 and 13 through the real gateway on a FakeClock: an odd HEARTBEAT.md
(a directory, unreadable) never stops the heartbeat — logged once, the beat follows the
missing-file rule — and out-of-range ``active_hours`` are refused at config load naming
the key (``24:00`` only as an end, meaning midnight)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from gateway.config.load import ConfigError, parse_config
from runtime.clock import FakeClock
from tests.fakes.fake_openai import FakeOpenAI
from tests.scheduler_harness import T0, beat, config, gateway

PROMPT_START = "Read HEARTBEAT.md if it exists"


@pytest.fixture
async def fake():
    async with FakeOpenAI() as server:
        yield server


def unreadable_logs(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"] == "heartbeat_file_unreadable"]


@pytest.mark.parametrize("oddity", ["directory", "symlink_loop"])
async def test_an_odd_heartbeat_file_is_logged_once_and_beats_go_on(tmp_path, fake, oddity):
    # (a symlink loop is unreadable even for root, unlike a chmod 0 file)
    clock = FakeClock(T0)
    cfg = config(tmp_path, fake.base_url, heartbeat={"every": "100h"})
    async with gateway(cfg, clock) as gw:
        path = gw.config.workspace_for("main") / "HEARTBEAT.md"
        if oddity == "directory":
            path.mkdir()
        else:
            path.symlink_to(path)  # ELOOP on open
        with capture_logs() as logs:
            for _ in range(3):
                fake.script_text("HEARTBEAT_OK")
                out = await beat(gw, clock)
                assert out.outcome == "ok", out  # ran like a beat without the file
        [err] = unreadable_logs(logs)
        assert err["log_level"] == "error" and err["path"] == str(path)
        assert "HEARTBEAT.md" in err["fix"]
        assert len(fake.requests) == 3
        assert fake.requests[-1].json["messages"][-1]["content"].startswith(PROMPT_START)
        assert "HEARTBEAT.md:\n" not in fake.requests[-1].json["messages"][-1]["content"]
        # Fixed: read again (and a later breakage would be logged again).
        if oddity == "directory":
            path.rmdir()
            path.write_text("- water the plants\n")
        else:
            path.unlink()
            path.write_text("- water the plants\n")
        fake.script_text("HEARTBEAT_OK")
        with capture_logs() as logs:
            await beat(gw, clock)
        assert unreadable_logs(logs) == []
        assert "HEARTBEAT.md:\n" in fake.requests[-1].json["messages"][-1]["content"]


@pytest.mark.parametrize(("window", "key"), [
    ({"start": "08:00", "end": "24:30"}, "end"),
    ({"start": "24:00", "end": "06:00"}, "start"),
    ({"start": "08:60", "end": "20:00"}, "start"),
    ({"start": "7", "end": "20:00"}, "start"),
])
def test_out_of_range_active_hours_are_refused_naming_the_key(tmp_path, fake, window, key):
    hb = {"every": "10m", "active_hours": window}
    with pytest.raises(ConfigError) as exc:
        parse_config(config(tmp_path, fake.base_url, heartbeat=hb), "test", env={})
    [problem] = exc.value.problems
    assert problem.startswith(f"agents.defaults.heartbeat.active_hours.{key}:")


def test_24_00_is_allowed_as_an_end(tmp_path, fake):
    hb = {"every": "10m", "active_hours": {"start": "08:00", "end": "24:00"}}
    loaded = parse_config(config(tmp_path, fake.base_url, heartbeat=hb), "test", env={})
    assert loaded.config.agent("main").heartbeat.active_hours.end == "24:00"
