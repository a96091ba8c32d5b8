"""``GET /metrics`` (issue 14 "Metrics"): scraped with the real prometheus text parser after
real turns against the fake model, a denied inbound message, a cron run and a beat."""

from __future__ import annotations

import math

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from channels.base import InboundMessage
from runtime.clock import FakeClock
from tests.fakes.fake_openai import FakeOpenAI
from tests.scheduler_harness import T0, beat, config, gateway, until

USAGE = {"prompt_tokens": 1000, "completion_tokens": 500}


async def scrape(gw, token: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.get(
            f"http://127.0.0.1:{gw.port}/metrics", headers=headers) as r:
        text = await r.text()
        if r.status != 200:
            return r.status, {}
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return 200, samples


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_after_real_turns(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = config(tmp_path, fake.base_url, heartbeat={"every": "100h", "target": "none"})
        cfg["pricing"] = {"fake/fake-model": {"input": 1000, "output": 2000}}
        async with gateway(cfg, clock) as gw:
            assert (await scrape(gw, None))[0] == 401  # the token is required
            fake.script_text("one", usage=USAGE)
            await gw.local.send("hi")
            fake.script_text("two", usage=USAGE)
            await gw.local.send("again")
            fake.script_error(400, message="bad tool schema")  # permanent: not retried
            assert (await gw.local.send("break")).status == "error"
            fake.script_text("HEARTBEAT_OK")
            await beat(gw, clock)
            job = await gw.scheduling.cron.add(__import__(
                "gateway.scheduling.cron_jobs", fromlist=["job_from_spec"]).job_from_spec(
                {"name": "j", "schedule": {"kind": "every", "interval": 3600},
                 "message": "m", "session_target": "isolated"},
                now=clock.time(), config=gw.config))
            fake.script_text("cron done")
            await gw.scheduling.cron.run_now(job.id)
            await gw.intake.on_message(InboundMessage(
                channel="telegram", account_id="default", chat_type="dm", peer_id="1",
                sender_id="1", text="hello"))  # runs a turn (no access policy configured)
            # on_message only queues the telegram turn: wait until it has run, not only
            # until nothing is queued (under load it was still running at the scrape)
            await until(lambda: gw.lanes.stats()["queued"] == 0
                        and not any(gw.lanes.stats()["running"].values()))
            await gw.timeline_hooks.flush()

            code, m = await scrape(gw, gw.token)
            assert code == 200
            assert value(m, "tidegate_turns_total", trigger="user", status="ok") == 3
            assert value(m, "tidegate_turns_total", trigger="user", status="error") == 1
            assert value(m, "tidegate_turns_total", trigger="heartbeat", status="ok") == 1
            assert value(m, "tidegate_turns_total", trigger="cron", status="ok") == 1
            assert value(m, "tidegate_turn_duration_seconds_count", trigger="user") == 4
            ok = value(m, "tidegate_model_calls_total", provider="fake", model="fake-model",
                       error_class="none")
            assert ok == 5
            failed = sum(v for (n, labels), v in m.items()
                         if n == "tidegate_model_calls_total" and
                         dict(labels)["error_class"] != "none")
            assert failed == 1
            assert value(m, "tidegate_model_tokens_total", provider="fake",
                         model="fake-model", kind="input") >= 2000
            assert value(m, "tidegate_model_cost_usd_total", provider="fake",
                         model="fake-model") >= 4.0
            assert value(m, "tidegate_model_call_duration_seconds_count", provider="fake",
                         model="fake-model") == 5
            assert value(m, "tidegate_heartbeat_outcomes_total", outcome="ok") == 1
            assert value(m, "tidegate_cron_runs_total", status="ok") == 1
            assert value(m, "tidegate_timeline_append_duration_seconds_count") > 5
            assert value(m, "tidegate_lane_queue_depth") == 0
            assert ("tidegate_lanes_active", (("kind", "main"),)) in m
            assert value(m, "tidegate_outbox_depth") == 0
            assert value(m, "tidegate_channel_connected", channel="webchat") == 1
            assert value(m, "tidegate_inbound_messages_total", channel="telegram",
                         outcome="queued") == 1
            # every accepted message has its one outcome (the telegram reply had no
            # running channel to go to: failed, like the refused model call)
            assert value(m, "tidegate_message_outcomes_total", outcome="replied") == 2
            assert value(m, "tidegate_message_outcomes_total", outcome="failed") == 2
            assert value(m, "tidegate_messages_without_outcome") == 0
            assert value(m, "tidegate_dead_letters") == 0


async def test_metrics_public_loopback(tmp_path):
    async with FakeOpenAI() as fake:
        cfg = config(tmp_path, fake.base_url)
        cfg["metrics"] = {"public_loopback": True}
        async with gateway(cfg, FakeClock(T0)) as gw:
            code, m = await scrape(gw, None)
            assert code == 200 and ("tidegate_lane_queue_depth", ()) in m


async def test_channel_reconnects_count_real_drops_on_the_fake_platforms(tmp_path):
    """The fake platforms drop the connection; the real adapters reconnect; the counter
    counts each reconnect (and not the first connect)."""
    from tests.channel_harness import until as until_true
    from tests.fakes.fake_discord import FakeDiscord
    from tests.fakes.fake_slack import FakeSlack
    from tests.fakes.fake_telegram import FakeTelegram
    from tests.helpers import base_config, running_gateway
    dc = FakeDiscord()
    await dc.start()
    slack = await FakeSlack().start()
    tg = await FakeTelegram().start()
    try:
        async with FakeOpenAI() as model:
            cfg = base_config(tmp_path / "state", model.base_url, channels={
                "discord": {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
                            "gateway_url": dc.gateway_url, "dm_policy": "open"},
                "slack": {"enabled": True, "bot_token": slack.bot_token,
                          "app_token": slack.app_token,
                          "api_base_url": slack.api_url.rstrip("/"), "dm_policy": "open"},
                "telegram": {"enabled": True, "token": tg.token,
                             "api_base_url": f"{tg.url}/bot", "poll_timeout": 1,
                             "dm_policy": "open"}})
            async with running_gateway(cfg) as gw:
                def states() -> dict:
                    return {n: s["state"] for n, s in gw.channel_status().items()
                            if n in ("webchat", "discord", "slack", "telegram")}
                await until_true(lambda: set(states().values()) == {"connected"},
                                 what="all three connected")
                _, before = await scrape(gw, gw.token)
                for name in ("discord", "slack", "telegram"):
                    assert value(before, "tidegate_channel_reconnects_total",
                                 channel=name) == 0
                for _ in range(2):  # two resumable drops: discord.py RESUMEs each time
                    resumes = dc.resume_count
                    await dc.close_gateways(4000)
                    await until_true(lambda r=resumes: dc.resume_count == r + 1
                                     and states()["discord"] == "connected",
                                     what="discord resumed")
                await slack.close_sockets()
                await until_true(lambda: gw.channel_status()["slack"].get("reconnects") == 1
                                 and states()["slack"] == "connected", timeout=15,
                                 what="slack reconnected")
                tg.fail("getUpdates", status=502, count=1)
                await until_true(lambda: gw.channel_status()["telegram"].get("reconnects")
                                 == 1 and states()["telegram"] == "connected", timeout=15,
                                 what="telegram reconnected")
                _, after = await scrape(gw, gw.token)
    finally:
        await tg.stop()
        await slack.stop()
        await dc.stop()
    assert value(after, "tidegate_channel_reconnects_total", channel="discord") == 2
    assert value(after, "tidegate_channel_reconnects_total", channel="slack") == 1
    assert value(after, "tidegate_channel_reconnects_total", channel="telegram") == 1
    assert value(after, "tidegate_channel_connected", channel="slack") == 1


def test_counted_families_render_as_prometheus_clients_own(monkeypatch):
    """The gateway counts without prometheus-client (issue 9: cold start) and renders at
    scrape time; the text is byte-for-byte what the library's own Counter and Histogram
    give for the same observations, ``_created`` series included (wall clock pinned)."""
    import time

    import prometheus_client as pc

    from gateway.server.metrics.counting import Counter, Histogram
    from gateway.server.metrics.exposition import counter_family, histogram_family

    now = [1_796_155_665.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    buckets = (0.005, 0.01, 0.5, 1, 60)
    ours = [Counter("t_turns", "Turns", ("trigger", "status")),
            Histogram("t_seconds", "Turn duration", ("trigger",), buckets=buckets),
            Histogram("t_append_seconds", "Append", buckets=buckets)]
    reg = pc.CollectorRegistry()
    theirs = [pc.Counter("t_turns", "Turns", ["trigger", "status"], registry=reg),
              pc.Histogram("t_seconds", "Turn duration", ["trigger"], buckets=buckets,
                           registry=reg),
              pc.Histogram("t_append_seconds", "Append", buckets=buckets, registry=reg)]
    for i, v in enumerate([0, 0.005, 0.0051, 1, 59.9, 60, 61, 1e6, float("nan")]):
        now[0] += 1.234567  # a new series is stamped with the same time on both sides
        trigger, status = ("user", "cron", "heartbeat")[i % 3], ("ok", "error")[i % 2]
        ours[0].inc((trigger, status), 1 if math.isnan(v) else v)
        theirs[0].labels(trigger, status).inc(1 if math.isnan(v) else v)
        ours[1].observe((trigger,), v)
        theirs[1].labels(trigger).observe(v)
        ours[2].observe((), v)
        theirs[2].observe(v)

    class Counted:
        def collect(self):
            yield counter_family(ours[0], True)
            yield histogram_family(ours[1], True)
            yield histogram_family(ours[2], True)

    mine, lib = pc.generate_latest(Counted()), pc.generate_latest(reg)
    assert b"t_seconds_created" in lib and b'le="+Inf"' in lib and b"NaN" in lib
    assert mine == lib
    with pytest.raises(ValueError):
        ours[0].inc(("user", "ok"), -1)
