"""Where a cron job's reply goes: the chat that created it, a named target, or nowhere;
never "whichever chat spoke most recently" (that sent one user's private reminder to
another user's Telegram DM). Two users on the fake Telegram; user B always speaks last.
The CLI runs in-process against the running gateway's control API."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from structlog.testing import capture_logs

from gateway.cli import main
from scheduler.cron.job import new_job
from tests.channel_harness import chat_requests, log_events, until
from tests.helpers import base_config, running_gateway

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning"),
]

ALICE, BOB = 1001, 2002


def tg_config(tmp_path, model, tg) -> dict:
    return base_config(tmp_path / "state", model.base_url, channels={"telegram": {
        "enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
        "poll_timeout": 1, "dm_policy": "open"}})


def texts(tg, chat: int) -> list[str]:
    return [m["text"] for m in tg.bot_messages(chat)]


async def test_a_job_delivers_to_the_chat_that_created_it_never_to_the_last_speaker(
        tmp_path, model, tg, capsys):
    cfg = tg_config(tmp_path, model, tg)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))

    async def cli(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["--config", str(path), *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    with capture_logs() as logs:  # log lines stay out of the CLI's captured stdout
        await _journey(tmp_path, model, tg, cfg, cli, logs)


async def _journey(tmp_path, model, tg, cfg, cli, logs) -> None:
    async with running_gateway(cfg) as gw:
        # Alice asks for a reminder in her DM: the agent's cron tool adds an isolated job.
        model.script_tool_call("cron", {"action": "add", "at": "20m", "session": "isolated",
                                        "name": "stretch", "message": "Tell me to stretch."})
        model.script_text("I will remind you.")
        tg.inject_message("remind me to stretch in 20 minutes", chat_id=ALICE, user_id=ALICE)
        await until(lambda: texts(tg, ALICE) == ["I will remind you."], what="Alice's reply")
        # Bob speaks after her: he is the most recent chat from here on.
        tg.inject_message("hello", chat_id=BOB, user_id=BOB)
        await until(lambda: texts(tg, BOB) == ["echo: hello"], what="Bob's reply")

        # The operator adds one from the CLI, without --to: no chat to reply to.
        code, out, err = await cli("cron", "add", "--name", "digest", "--every", "1h",
                                   "--message", "Summarise the day.", "--session", "isolated")
        assert code == 0, err
        assert out.startswith("added cron job ") and out.rstrip().endswith(
            "--to <channel>:<to>)") and "delivers nowhere (no target: tidegate cron edit" in out
        # An older store's "last" job (kept working: it no longer follows the last chat).
        legacy = await gw.scheduling.cron.add(new_job(
            name="old", schedule={"kind": "every", "interval": 3600}, message="Old job.",
            now=gw.clock.time(), session_target="isolated", delivery="last"))

        code, out, err = await cli("cron", "list", "--json")
        assert code == 0, err
        jobs = {j["name"]: j for j in json.loads(out)}
        assert jobs["stretch"]["deliver_to"] == f"telegram:{ALICE}"
        assert jobs["stretch"]["delivery"] == "origin"
        assert jobs["stretch"]["origin"] == {"channel": "telegram", "account": "default",
                                             "to": str(ALICE), "thread": None}
        assert (jobs["digest"]["delivery"], jobs["digest"]["deliver_to"]) == ("none", None)
        assert jobs["old"]["deliver_to"] is None and "no longer follows" in \
            jobs["old"]["delivery_warning"]
        code, out, err = await cli("cron", "list")
        assert code == 0, err
        header, *rows = out.splitlines()
        assert "DELIVERS TO" in header
        row = {line.split()[0]: line for line in rows}
        assert f"telegram:{ALICE}" in row[jobs["stretch"]["id"]]
        assert "nowhere" in row[jobs["digest"]["id"]] and "nowhere" in row[legacy.id]
        assert err == f"warning: {jobs['old']['delivery_warning']}\n"

        for name, reply in (("stretch", "Time to stretch!"), ("digest", "Quiet day."),
                            ("old", "Old output.")):
            n = len(chat_requests(model))
            model.script_text(reply)
            code, out, err = await cli("cron", "run", jobs[name]["id"])
            assert code == 0, err
            assert len(chat_requests(model)) == n + 1
            first = out.splitlines()[0]
            if name == "stretch":
                assert first == f"ran cron job {jobs[name]['id']}: ok (delivered)"
            else:
                assert "ok (not delivered: the job has no delivery target" in first
        await until(lambda: len(texts(tg, ALICE)) == 2, what="Alice's reminder")
        await asyncio.sleep(0.3)  # a wrong send would have reached the fake by now
        assert texts(tg, ALICE) == ["I will remind you.", "Time to stretch!"]
        assert texts(tg, BOB) == ["echo: hello"]  # nothing of anybody's jobs
        # the stored 'last' is named in the log (a plain 'none' is the operator's choice)
        assert [e["job_id"] for e in log_events(logs, "cron_no_delivery_target")] == [
            legacy.id]

        # A target named later is followed; the CLI says where.
        code, out, err = await cli("cron", "edit", jobs["digest"]["id"], "--to",
                                   f"telegram:{BOB}")
        assert code == 0, err and f"delivers to telegram:{BOB}" in out
        # 'last' is no longer accepted for a new job (exit 2, the key named)
        code, out, err = await cli("cron", "add", "--name", "x", "--every", "1h", "--message",
                                   "m", "--session", "isolated", "--deliver", "last")
        assert code == 2 and err.startswith("error: delivery: 'last' is no longer accepted")
