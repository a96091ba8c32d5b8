"""All three platforms in one gateway: channel states in ``tidegate status --json``, and
replies that could not be delivered surviving a gateway restart in the on-disk outbox
(issue 3 "Outbound": "retried later, including after a restart").

The restart test runs the real daemon (``tidegate gateway``) as a subprocess, with the
fake platforms and the fake model in background threads, driven through their control
endpoints as another process would.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from tests.channel_harness import chat_requests, outbox_files, run_cli, until, write_config
from tests.fakes import fake_discord, fake_slack, fake_telegram
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_slack import FakeSlack
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import GatewayProcess, base_config, running_gateway

pytestmark = [
    pytest.mark.timeout(180),  # two gateway starts, each allowed 60 s (tests/helpers.py)
    pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning"),
]

TG_USER = 4242


def control(url: str, action: str, body: dict[str, Any] | None = None) -> Any:
    """POST (or GET when ``body`` is None) ``<url>/_control/<action>`` of a fake."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{url}/_control/{action}", data=data,
                                 headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def wait(pred: Any, timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def platforms():
    model = FakeOpenAI.start_in_thread()
    tg = fake_telegram.start_in_thread()
    slack = fake_slack.start_in_thread()
    dc = fake_discord.start_in_thread()
    yield model, tg, slack, dc
    for handle in (dc, slack, tg, model):
        handle.stop()


def three_channel_config(state_dir: Any, model: Any, tg: Any, slack: Any, dc: Any) -> dict:
    """Streaming off: these tests count posted messages (tests/test_streaming*.py prove
    streamed replies, including across a kill -9)."""
    return base_config(state_dir, model.base_url, channels={
        "telegram": {"enabled": True, "token": tg.fake.token,
                     "api_base_url": f"{tg.url}/bot", "poll_timeout": 1,
                     "dm_policy": "open", "streaming": "off"},
        "slack": {"enabled": True, "bot_token": slack.fake.bot_token,
                  "app_token": slack.fake.app_token, "api_base_url": slack.api_url,
                  "dm_policy": "open", "streaming": "off"},
        "discord": {"enabled": True, "token": dc.fake.token, "api_base_url": dc.api_url,
                    "gateway_url": dc.gateway_url, "dm_policy": "open", "streaming": "off"}})


def delivered(tg: Any, slack: Any, dc: Any) -> dict[str, list[str]]:
    """What each platform accepted from the bot, by platform."""
    dm = dc.fake.dm_channels.get(dc.fake.alice.id, "none")
    return {
        "telegram": [m["text"] for m in tg.call(tg.fake.bot_messages, TG_USER)],
        "slack": [s["payload"]["text"] for s in control(slack.url, "sent")
                  if s["method"] == "chat.postMessage"],
        # messages the channel shows: a resend answered from its nonce is not a second one
        "discord": dc.fake.chat_view(dm),
    }


def test_outbox_replies_survive_a_gateway_restart(tmp_path, platforms):
    model, tg, slack, dc = platforms
    state = tmp_path / "state"
    gp = GatewayProcess(tmp_path, three_channel_config(state, model, tg, slack, dc)).start()
    try:
        status = json.loads(gp.cli("status", "--json").stdout)
        assert {n: status["channels"][n]["state"] for n in ("telegram", "slack", "discord")} \
            == {"telegram": "connected", "slack": "connected", "discord": "connected"}
        # every platform now refuses our sends (HTTP 5xx: worth retrying later)
        tg.call(tg.fake.fail, "sendMessage", status=500, count=1000)
        control(slack.url, "fail", {"method": "chat.postMessage", "kind": "5xx",
                                    "count": 1000})
        control(dc.url, "fail", {"kind": "status", "status": 503, "count": 1000})
        update = tg.call(tg.fake.inject_message, "hello from telegram", chat_id=TG_USER,
                         user_id=TG_USER)
        control(slack.url, "event", {"kind": "dm", "text": "hello from slack"})
        control(dc.url, "dm", {"text": "hello from discord"})
        entries = wait(lambda: len(outbox_files(state)) == 3 and outbox_files(state),
                       what="three outbox entries")
        assert {e["message"]["channel"]: e["message"]["text"] for e in entries} == {
            "telegram": "echo: hello from telegram", "slack": "echo: hello from slack",
            "discord": "echo: hello from discord"}
        assert json.loads(gp.cli("status", "--json").stdout)["outbox"]["pending"] == 3
    finally:
        gp.kill9()  # no graceful anything: the entries must already be on disk
    assert len(outbox_files(state)) == 3
    assert delivered(tg, slack, dc) == {"telegram": [], "slack": [], "discord": []}

    for url in (tg.url, slack.url, dc.url):  # the platforms recover
        control(url, "reset", {})
    gp.start()
    try:
        got = wait(lambda: all(delivered(tg, slack, dc).values())
                   and delivered(tg, slack, dc), what="the queued replies")
        assert got == {"telegram": ["echo: hello from telegram"],
                       "slack": ["echo: hello from slack"],
                       "discord": ["echo: hello from discord"]}
        wait(lambda: not outbox_files(state), what="the outbox to drain")
        # Telegram redelivers the first update after the restart: it never runs again
        tg.call(tg.fake.redeliver, update)
        tg.call(tg.fake.inject_message, "sentinel", chat_id=TG_USER, user_id=TG_USER)
        wait(lambda: "echo: sentinel" in delivered(tg, slack, dc)["telegram"],
             what="the sentinel reply")
        assert len(chat_requests(model.server)) == 4
        status = json.loads(gp.cli("status", "--json").stdout)
        assert status["outbox"]["pending"] == 0
        assert all(status["channels"][n]["state"] == "connected"
                   for n in ("telegram", "slack", "discord"))
    finally:
        assert gp.stop() == 0
    logs = gp.log_lines()
    assert any(r["event"] == "outbox_loaded" and r["pending"] == 3 for r in logs)
    # delivered as soon as each channel was connected, not at the outbox's next backoff
    assert {r["channel"] for r in logs if r["event"] == "outbox_woken"} == {
        "telegram", "slack", "discord"}
    assert {r["channel"] for r in logs if r["event"] == "outbox_sent"} == {
        "telegram", "slack", "discord"}
    assert any(r["event"] == "inbound_duplicate" and r["channel"] == "telegram"
               for r in logs)


async def test_status_json_shows_each_channel_state(tmp_path):
    tg = await FakeTelegram().start()
    slack = await FakeSlack().start()
    await slack.set_outage(True, "refuse")  # Slack unreachable while the gateway starts
    try:
        async with FakeOpenAI() as model:
            cfg = base_config(tmp_path / "state", model.base_url, channels={
                "telegram": {"enabled": True, "api_base_url": f"{tg.url}/bot",
                             "poll_timeout": 1, "dm_policy": "open",
                             "accounts": {"main": {"token": tg.token},
                                          "broken": {"token": "999:not-the-token"}}},
                "slack": {"enabled": True, "bot_token": slack.bot_token,
                          "app_token": slack.app_token, "api_base_url": slack.api_url},
                "discord": {"enabled": False, "token": "unused"}})
            path = write_config(tmp_path, cfg)
            async with running_gateway(cfg) as gw:
                rc, out, _ = await run_cli(path, "status", "--json")
                states = {k: v["state"] for k, v in json.loads(out)["channels"].items()}
                assert rc == 0 and states == {
                    "webchat": "connected", "telegram:main": "connected",
                    "telegram:broken": "failed", "slack": "reconnecting",
                    "discord": "disabled", "whatsapp": "disabled",
                    "email": "disabled", "matrix": "disabled"}  # every installed plugin
                failed = json.loads(out)["channels"]["telegram:broken"]
                assert "token" in failed["last_error"] and "not-the-token" not in out

                await slack.set_outage(False)
                await until(lambda: gw.status()["channels"]["slack"]["state"] == "connected",
                            what="slack to reconnect")
                rc, out, _ = await run_cli(path, "status")
                assert rc == 0 and "channel slack: connected" in out
                assert "channel telegram:broken: failed" in out
                # one failed account does not stop the other from working
                tg.inject_message("still working?", chat_id=TG_USER, user_id=TG_USER)
                await until(lambda: tg.bot_messages(TG_USER), what="the healthy account")
    finally:
        await slack.stop()
        await tg.stop()


def test_discord_messages_missed_by_a_kill9_gateway_are_caught_up(tmp_path):
    """A DM read from the socket but not yet journaled when the gateway is SIGKILLed, or
    sent while it is down, is replayed at the next start (a RESUME of the stored session)
    and answered once; the one answered before the crash is not answered again."""
    model, dc = FakeOpenAI.start_in_thread(), fake_discord.start_in_thread()
    gp = GatewayProcess(tmp_path, base_config(tmp_path / "state", model.base_url, channels={
        "discord": {"enabled": True, "token": dc.fake.token, "api_base_url": dc.api_url,
                    "gateway_url": dc.gateway_url, "dm_policy": "open",
                    "streaming": "off"}}))  # counts posted messages, like the tests above

    def replies() -> list[str]:
        # what the DM shows: a resend after the kill -9 answered from its nonce (resume of
        # a reply whose send outcome was unknown) is the same message, not a second one
        return dc.fake.chat_view(dc.fake.dm_channels.get(dc.fake.alice.id, "none"))
    try:
        gp.start()
        control(dc.url, "dm", {"text": "before the crash"})
        wait(lambda: replies() == ["echo: before the crash"], what="the first reply")
        gp.kill9()
        control(dc.url, "dm", {"text": "while you were down"})  # nobody is connected
        gp.start()
        wait(lambda: "echo: while you were down" in replies(), timeout=30,
             what="the caught-up reply")
        time.sleep(1.0)  # a second answer to either message would have arrived by now
        assert replies() == ["echo: before the crash", "echo: while you were down"]
        # the restart RESUMEd the session and Discord replayed the missed DM (the REST
        # catch-up is the fallback when a RESUME is refused: tests/test_discord_resume.py)
        connects = [e for e in gp.log_lines() if e.get("event") == "discord_connected"]
        assert connects[-1]["resumed"] is True
    finally:
        if gp.proc is not None and gp.proc.poll() is None:
            gp.stop()
        dc.stop()
        model.stop()
