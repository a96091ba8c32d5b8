"""The outcome rule under faults (docs/outcomes.md): 180 messages over Telegram, Slack,
Discord, the OpenAI-compatible API and the local chat while the model fails every fourth
call with a 500, after a crash left a poison message (the process died on it 3 times) and
a turn cut off before any tool ran. Afterwards every accepted message has exactly one
outcome, nothing is left without one, no chat shows a reply twice, and the dead-letter
list holds exactly the poison message.

What it does not do (in-process): a real ``kill -9`` (the journal lines such a crash leaves
are written instead, as tests/test_intake_journal_crash.py proves they are) and stopping
PostgreSQL."""

from __future__ import annotations

import json
from collections import Counter

import aiohttp
import pytest

from gateway.journal.store import FILE_NAME as JOURNAL_FILE
from gateway.journal.store import IntakeJournal
from runtime.clock import SYSTEM_CLOCK
from tests.channel_harness import until
from tests.helpers import base_config, running_gateway
from tests.test_outcomes import crashed

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

TG_USERS = (5001, 5002, 5003)
N_TG, N_SLACK, N_DC, N_API, N_LOCAL = 60, 40, 30, 30, 20  # 180 messages, + 2 from the crash


def gateway_config(tmp_path, model, tg, slack, dc) -> dict:
    common = {"dm_policy": "open", "streaming": "off"}
    return base_config(tmp_path / "state", model.base_url, channels={
        "telegram": {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                     "poll_timeout": 1, **common},
        "slack": {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
                  "api_base_url": slack.api_url, **common},
        "discord": {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
                    "gateway_url": dc.gateway_url, **common}})


def rows(state) -> list[dict]:
    lines = (state / JOURNAL_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["op"] == "done" and r.get("outcome")]


async def test_every_accepted_message_has_one_outcome_under_faults(tmp_path, model, tg,
                                                                   slack, dc):
    state = tmp_path / "state"
    journal = IntakeJournal(state / JOURNAL_FILE, SYSTEM_CLOCK)
    journal.load()
    poison = crashed(journal, "agent:main:telegram:dm:5009", 5009, "poison",
                     [["exec"], ["exec"], ["exec"]])
    crashed(journal, "agent:main:telegram:dm:5008", 5008, "cut-off", [[]])  # re-run
    journal.close()
    calls = {"n": 0}

    def responder(body):  # every 4th model call fails: the message ends failed
        calls["n"] += 1
        if calls["n"] % 4 == 0:
            return {"type": "error", "status": 500, "message": "upstream down"}
        return f"echo: {model.last_user_text(body)[-40:]}"
    model.responder = responder
    async with running_gateway(gateway_config(tmp_path, model, tg, slack, dc)) as gw:
        await until(lambda: all(gw.channel_status()[c]["state"] == "connected"
                                for c in ("telegram", "slack", "discord")), timeout=20)
        for i in range(N_TG):
            tg.inject_message(f"tg {i}", chat_id=TG_USERS[i % 3], user_id=TG_USERS[i % 3])
        for i in range(N_SLACK):
            await slack.push_event(slack.dm(f"slack {i}"))
        for i in range(N_DC):
            await dc.send_dm(f"discord {i}")
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {gw.token}"}) as s:
            for i in range(N_API):
                async with s.post(f"http://127.0.0.1:{gw.port}/v1/chat/completions", json={
                        "model": "tidegate/main", "user": f"api{i % 2}",
                        "messages": [{"role": "user", "content": f"api {i}"}]}) as r:
                    assert r.status in (200, 502)  # a failure is an error, never a 200
        for i in range(N_LOCAL):
            await gw.local.send(f"local {i}", channel="webchat", to=f"w{i % 2}")
        total = N_TG + N_SLACK + N_DC + N_API + N_LOCAL + 2  # + the poison and the cut-off turn
        await until(lambda: len(gw.journal.outcomes) >= total, timeout=40, what="outcomes")
        await until(lambda: not gw.journal.unfinished(), what="nothing left unfinished")
        assert gw.status()["outcomes"]["unresolved"] == 0
        assert [d["id"] for d in gw.status()["outcomes"]["dead_letters_recent"]] == [poison]
    done = rows(state)
    assert len(done) == total
    per_channel = Counter(r["channel"] for r in done)
    assert per_channel == {"telegram": N_TG + 2, "slack": N_SLACK, "discord": N_DC,
                           "openai": N_API, "webchat": N_LOCAL}
    platform = [(r["session_key"], r["message_id"]) for r in done if not r.get("local")]
    assert len(platform) == len(set(platform)) == N_TG + N_SLACK + N_DC + 2  # one outcome each
    outcomes = Counter(r["outcome"] for r in done)
    assert outcomes["dead-lettered"] == 1 and outcomes["failed"] >= total // 5
    assert outcomes["replied"] + outcomes["failed"] + 1 == total
    chats = [[m["text"] for m in tg.bot_messages(u)] for u in (*TG_USERS, 5008, 5009)]
    chats += [slack.chat_view("D0ALICE"),
              [p["payload"]["content"] for p in dc.sent_messages(dc.dm_channels[dc.alice.id])]]
    for texts in chats:  # no reply twice (each echo names its own message)
        replies = [t for t in texts if t.startswith("echo")]
        assert len(replies) == len(set(replies)), texts
