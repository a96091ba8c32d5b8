"""Usage, cost and budgets (issue 14): the fake model reports known token counts, the
ledger records each call with its cost, budgets stop background work first, then user
turns with a plain notice, alert once at 80 %, reset at local midnight (FakeClock), and the
operator can raise or reset them from the CLI."""

from __future__ import annotations

import asyncio
import json

import yaml

from runtime.clock import FakeClock, parse_iso
from runtime.usage.pricing import BUILTIN_PRICES, cost_usd, price_for
from tests.fakes.fake_openai import FakeOpenAI
from tests.scheduler_harness import beat, config, gateway, until

T0 = parse_iso("2026-01-01T00:00:00Z")  # 01:00 in Berlin
USAGE = {"prompt_tokens": 1000, "completion_tokens": 500}  # $1 + $1 at the prices below
CLI_KEY = "agent:main:cli:dm:local"


def budget_config(tmp_path, url, **budgets):
    cfg = config(tmp_path, url, heartbeat={"every": "100h", "target": "none"},
                 tz="Europe/Berlin")
    cfg["pricing"] = {"fake/fake-model": {"input": 1000, "output": 2000}}
    cfg["budgets"] = {"daily_usd": 10, "alert_at": 0.8, "user_reserve": 0.2,
                      "alert_target": "testchan:owner", **budgets}
    return cfg


def ledger(gw) -> list[dict]:
    out = []
    for path in sorted((gw.state_dir / "usage").glob("*.jsonl")):
        out += [json.loads(x) for x in path.read_text().splitlines()]
    return out


def test_builtin_prices_and_cost():
    gpt = price_for("openai", "gpt-4o-mini-2024-07-18")
    assert gpt == BUILTIN_PRICES["gpt-4o-mini"]  # the longest prefix, not gpt-4o
    assert price_for("anthropic", "claude-sonnet-4-20250514").output == 15.0
    assert price_for("fake", "nothing-known") is None
    # 1M prompt tokens of which 400k cached, 100k out, on gpt-4o: 0.6*2.5 + 0.4*1.25 + 0.1*10
    usage = {"input": 1_000_000, "cacheRead": 400_000, "output": 100_000}
    assert abs(cost_usd(usage, BUILTIN_PRICES["gpt-4o"]) - 3.0) < 1e-9


async def test_budget_alert_background_stop_user_notice_and_midnight_reset(tmp_path):
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        async with gateway(budget_config(tmp_path, fake.base_url), clock) as gw:
            for i in range(4):  # $8 of $10: the 80 % alert, once
                fake.script_text(f"answer {i}", usage=USAGE)
                assert (await gw.local.send(f"q{i}")).status == "ok"
            await until(lambda: gw.testchan.texts("alert"))
            [alert] = gw.testchan.texts("alert")
            assert "Budget alert: today's spend is $8.00 of $10.00 (80%)" in alert
            assert "Europe/Berlin" in alert
            rows = ledger(gw)
            assert len(rows) == 4 and {r["cost_usd"] for r in rows} == {2.0}
            assert rows[0]["channel"] == "cli" and rows[0]["agent"] == "main"
            assert (rows[0]["input"], rows[0]["output"]) == (1000, 500)

            # background work stops first: at 8 >= 10 * (1 - 0.2) no beat reaches the model
            calls = len(fake.requests)
            outcome = await beat(gw, clock)
            assert outcome.outcome == "skipped" and "budget" in outcome.reason
            assert len(fake.requests) == calls
            # ... and so does a cron run (background too): refused before the model
            from gateway.scheduling.cron_jobs import job_from_spec
            job = await gw.scheduling.cron.add(job_from_spec(
                {"name": "digest", "schedule": {"kind": "every", "interval": 3600},
                 "message": "summarise", "session_target": "isolated"},
                now=gw.clock.time(), config=gw.config))
            ran = await gw.scheduling.cron.run_now(job.id)
            assert ran.status != "ok" and "budget" in (ran.error or ran.reply or ""), ran
            assert len(fake.requests) == calls

            # a user turn still runs; its tool round takes the spend to the cap, and the
            # next round is refused: never more than one model call over the cap
            fake.push({"type": "tool_calls", "text": "", "usage": USAGE, "calls": [
                {"id": None, "name": "write", "arguments": {"path": "x.txt", "content": "x"}}]})
            result = await gw.local.send("write it")
            assert result.status == "refused"
            assert result.text == ("today's budget ($10.00) is used up; resets at 00:00 "
                                   "Europe/Berlin.")
            assert len(fake.requests) == calls + 1
            assert sum(r["cost_usd"] for r in ledger(gw)) <= 10.0 + 2.0

            result = await gw.local.send("anyone there?")
            assert result.status == "refused" and len(fake.requests) == calls + 1
            assert len(gw.testchan.texts("alert")) == 1  # still one alert
            status = gw.status()["usage"]
            assert status["today"]["cost_usd"] == 10.0
            assert status["budgets"][0]["share"] == 1.0

            # local midnight in Berlin (23:00 UTC): a new day, a new budget
            await clock.advance(parse_iso("2026-01-01T23:00:00Z") - clock.time())
            fake.script_text("good morning", usage=USAGE)
            result = await gw.local.send("new day?")
            assert result.status == "ok" and result.text == "good morning"


async def test_budget_stops_a_subagent_run_before_its_model_call(tmp_path):
    """At the background share of the cap a user turn still runs, but the subagent it
    spawns is refused before the child's first model call (issue 14: "At 100 %, background
    work stops first (heartbeat, cron, subagents)")."""
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        async with gateway(budget_config(tmp_path, fake.base_url), clock) as gw:
            for i in range(4):  # $8 of $10: background work stops at 10 * (1 - 0.2)
                fake.script_text(f"answer {i}", usage=USAGE)
                assert (await gw.local.send(f"q{i}")).status == "ok"
            tiny = {"prompt_tokens": 1, "completion_tokens": 1}
            fake.push({"type": "tool_calls", "text": "", "usage": tiny, "calls": [
                {"id": None, "name": "sessions_spawn",
                 "arguments": {"task": "find tide tables"}}]})
            fake.script_text("spawned a helper", usage=tiny)
            result = await gw.local.send("get me the tide tables")
            assert result.status == "ok", result
            [rec] = gw.subagents.runs_of(CLI_KEY)
            await until(lambda: not rec.active)
            assert rec.status == "refused", rec
            assert "budget" in str((rec.outcome or {}).get("error")), rec.outcome
            child = [r for r in fake.requests
                     if "Subagent run: " in str(r.json["messages"][0]["content"])]
            assert child == []  # the child never reached the model
            assert not any(r["session_key"] == rec.child_session_key for r in ledger(gw))


async def test_usage_and_budget_from_the_cli_and_chat(tmp_path):
    from tests.test_cron_cli import cli
    clock = FakeClock(T0)
    async with FakeOpenAI() as fake:
        cfg = budget_config(tmp_path, fake.base_url, daily_usd=4)
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        async with gateway(cfg, clock) as gw:
            for i in range(2):
                fake.script_text(f"a{i}", usage=USAGE)
                await gw.local.send(f"q{i}")
            assert (await gw.local.send("more")).status == "refused"
            code, out, err = await cli(path, "budget", "raise", "--daily-usd", "6")
            assert code == 0, err
            assert "daily: $4.00 of $6.00 (67%)" in out
            fake.script_text("raised", usage=USAGE)
            assert (await gw.local.send("again")).text == "raised"
            code, out, err = await cli(path, "budget", "reset")
            assert code == 0 and "daily: $0.00 of $6.00" in out, err

            usage = (await gw.local.send("/usage")).text
            assert "Usage today: this session 3 calls, 3000/1500 tokens in/out, $6.0000" \
                in usage

            code, out, err = await cli(path, "usage", "--by", "model", "--json")
            rep = json.loads(out)
            assert rep["total"]["calls"] == 3 and rep["total"]["cost_usd"] == 6.0
            assert rep["rows"][0]["key"] == "fake/fake-model"
            code, out, _ = await cli(path, "usage", "--by", "day")
            assert "2026-01-01" in out and "6.0000" in out
            code, out, _ = await cli(path, "usage", "--channel", "telegram", "--json")
            assert json.loads(out)["total"]["calls"] == 0
        # the ledger survives a restart and the budget counts it again
        async with gateway(cfg, clock) as gw:
            assert gw.status()["usage"]["today"]["cost_usd"] == 6.0
            await asyncio.sleep(0)


def test_operator_output_counts_in_words_and_echo_needs_no_price():
    """QA (issue 14 point 6): `1 model call`, not `1 model calls`; the built-in echo model
    is free, so the usage report does not ask for a price for it."""
    from gateway.cli.output import render_status
    from runtime.usage.report import render, summarize

    rec = {"provider": "echo", "model": "diagnostic", "priced": False, "input": 3,
           "output": 1, "ts": 0.0}
    report = summarize([rec, {**rec, "provider": "x", "model": "y"}])
    assert report["unpriced"] == ["x/y"] and "no price for: x/y" in render(report)
    text = render_status({"pid": 1, "uptime_s": 1, "usage": {"today": {
        "calls": 1, "input_tokens": 3, "output_tokens": 1, "cost_usd": 0.0}}})
    assert "usage today: 1 model call, 3 in / 1 out tokens" in text


def test_budget_periods_follow_the_clock_across_local_midnight_and_month_end(tmp_path):
    """The period names are kept between calls; they still turn at the local midnight
    of the budget's time zone, and a clock set back gets the earlier period."""
    from runtime.usage.budget import Budgets
    from runtime.usage.config import BudgetsSection

    clock = FakeClock(parse_iso("2026-01-31T22:59:59Z"))  # 23:59:59 in Berlin
    b = Budgets(BudgetsSection(), tz="Europe/Berlin", clock=clock,
                state_path=tmp_path / "budgets.json")
    seen = []
    for i in range(3):
        clock.set_wall(parse_iso("2026-01-31T22:59:59Z") + i)
        now = clock.time()
        seen.append((b.period("daily", now), b.period("monthly", now)))
    assert seen == [("2026-01-31", "2026-01"), ("2026-02-01", "2026-02"),
                    ("2026-02-01", "2026-02")]
    assert b.period("daily", parse_iso("2026-01-31T12:00:00Z")) == "2026-01-31"
    assert b.period("daily", parse_iso("2026-02-01T23:00:00Z")) == "2026-02-02"
    b.add("main", 1.5)
    b.add("main", 0.5)
    assert b.spend[("daily", "main", "2026-02-01")] == 2.0
    assert b.caps("main", clock.time()) == []  # nothing configured


def test_ledger_month_files_follow_the_clock_across_month_end_and_back(tmp_path):
    """The UTC month is kept between appends; a record goes to its own month's file at
    the boundary, across a year end, and when the clock is set back."""
    from runtime.storage.embedded.usage_files import UsageFiles

    files = UsageFiles(tmp_path / "usage")
    stamps = ["2026-01-31T23:59:59.500Z", "2026-02-01T00:00:00.000Z",
              "2026-12-31T23:59:59.000Z", "2027-01-01T00:00:00.000Z",
              "2026-12-15T00:00:00.000Z"]
    for ts in stamps:
        files.append({"at": ts}, parse_iso(ts))
    files.close()
    got = {p.name: [json.loads(x)["at"] for x in p.read_text().splitlines()]
           for p in (tmp_path / "usage").iterdir()}
    assert got == {"2026-01.jsonl": [stamps[0]], "2026-02.jsonl": [stamps[1]],
                   "2026-12.jsonl": [stamps[2], stamps[4]], "2027-01.jsonl": [stamps[3]]}
