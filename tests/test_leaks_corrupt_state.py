"""Issue 8 item 11: a corrupt state file disables only the piece that owns it. With a
``cron/jobs.json`` cut at two thirds, a garbled heartbeat alert ledger, inbound dedupe
ledger, pairing file and outbox entry, the whole gateway (real python-telegram-bot against
FakeTelegram, the fake model) still starts and answers a Telegram DM; each owner logs one
structured ERROR naming the file and the fix, ``status.problems`` lists every one, and no
corrupt byte is destroyed."""

from __future__ import annotations

import json

import aiohttp
import pytest
from structlog.testing import capture_logs

from channels.base import OutboundMessage
from channels.outbound.outbox import Outbox
from runtime.clock import SYSTEM_CLOCK
from tests.channel_harness import log_events, run_cli, until, write_config
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(40),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER = 4242
JOBS = json.dumps({"version": 1, "jobs": [
    {"id": "a1b2c3", "name": "digest", "enabled": True, "agent": "main",
     "schedule": {"kind": "every", "interval": 60}, "payload": {"message": "digest"},
     "session_target": "isolated", "delivery": "none"}]}, indent=1).encode()


def corrupt_state(state) -> dict[str, bytes]:
    """Write the broken files; returns path -> bytes that must survive."""
    good = Outbox(state / "outbox", SYSTEM_CLOCK)  # one valid queued reply besides
    good.put(OutboundMessage(channel="telegram", to=str(USER), text="queued earlier"), "down")
    files = {
        state / "cron" / "jobs.json": JOBS[: len(JOBS) * 2 // 3],
        state / "heartbeat" / "delivered.json": b'[["main", "zz", 1.0], {"oops',
        state / "channels" / "inbound-seen.jsonl":
            b'[1.0, "telegram:default:1:1"]\n\x00\xff garbage\n[2.0, "telegram:default:1:2"]\n',
        state / "pairing" / "telegram.json": b'{"pending": [], "approved": [{"account_id"',
        state / "outbox" / "0000000001-bad.json": b'{"id": "0000000001-bad", "message": ',
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


async def test_corrupt_state_files_disable_only_their_owners(tmp_path, model, tg):
    state = tmp_path / "state"
    files = corrupt_state(state)
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open"}
    cfg = base_config(state, model.base_url, channels={"telegram": section},
                      agents={"defaults": {"model": "fake/fake-model",
                                           "heartbeat": {"every": "1h"}}})
    model.script_text("still here")
    with capture_logs() as logs:
        async with running_gateway(cfg) as gw:
            tg.inject_message("hello", chat_id=USER, user_id=USER)
            await until(lambda: any(m["text"] == "still here" for m in tg.bot_messages(USER)),
                        what="the DM reply")
            # The valid outbox entry next to the corrupt one is delivered.
            await until(lambda: any(m["text"] == "queued earlier"
                                    for m in tg.bot_messages(USER)), what="the outbox entry")
            headers = {"Authorization": f"Bearer {gw.token}"}
            async with aiohttp.ClientSession(headers=headers) as s:
                async with s.get(f"http://127.0.0.1:{gw.port}/status") as r:
                    status = await r.json()
                async with s.get(f"http://127.0.0.1:{gw.port}/api/cron") as r:
                    cron_status, cron_body = r.status, await r.json()
            # The approval check fails closed; pairing refuses to write the broken file.
            assert not gw.pairing.is_approved("telegram", "default", "1")
            code, _out, err = await run_cli(write_config(tmp_path, cfg), "pairing", "approve",
                                            "telegram", "ABCD1234")
    errors = log_events(logs, "state_file_corrupt")
    owners = {e["owner"]: e for e in errors}
    assert set(owners) == {"cron", "heartbeat alert ledger", "inbound dedupe ledger",
                           "pairing (telegram)", "outbox"}
    assert len(errors) == 5 and all(e["log_level"] == "error" and e["fix"] for e in errors)
    for e in errors:
        assert str(e["path"]) in {str(p) for p in files}
    problems = status["problems"]
    for path in files:
        assert any(str(path) in p for p in problems), (path, problems)
    assert status["scheduler"]["cron"]["enabled"] is False
    assert "jobs.json" in status["scheduler"]["cron"]["error"]
    assert cron_status == 503 and "jobs.json" in cron_body["error"]
    assert code == 1 and "telegram.json" in err and "Fix:" in err
    # No corrupt byte is destroyed: kept in place, or copied/moved aside.
    jobs, pairing = state / "cron" / "jobs.json", state / "pairing" / "telegram.json"
    assert jobs.read_bytes() == files[jobs] and pairing.read_bytes() == files[pairing]
    assert (state / "outbox" / "0000000001-bad.json.corrupt").read_bytes() == \
        files[state / "outbox" / "0000000001-bad.json"]
    for name in ("delivered.json", "inbound-seen.jsonl"):
        [copy] = list(state.glob(f"*/{name}.corrupt-*"))
        assert copy.read_bytes() in files.values()


async def test_a_directory_in_place_of_the_dedupe_ledger_only_turns_dedupe_off(tmp_path, model):
    state = tmp_path / "state"
    (state / "channels" / "inbound-seen.jsonl").mkdir(parents=True)
    with capture_logs() as logs:
        async with running_gateway(base_config(state, model.base_url)) as gw:
            model.script_text("fine")
            assert (await gw.local.send("hi")).text == "fine"
            assert any("inbound-seen.jsonl" in p for p in gw.status()["problems"])
    [err] = log_events(logs, "state_file_corrupt", owner="inbound dedupe ledger")
    assert "move" in err["fix"]
