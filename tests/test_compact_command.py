"""``/compact`` (issue 13 "Commands"): the session's older context is summarised now —
the transcript gets a compaction entry and the next turn sees the summary instead of the
oldest messages; an empty session has nothing to compact. Through the whole gateway on
Telegram against the fake model server."""

from __future__ import annotations

import json

import pytest

from runtime.compaction import SUMMARY_SYSTEM
from tests.channel_harness import chat_requests, until
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER = 4242
SUMMARY = "SUMMARY: the user asked about ferries and tides."


async def test_compact_summarises_older_context_now(tmp_path):
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                       "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
            cfg = base_config(tmp_path / "s", model.base_url, channels={"telegram": section})

            def texts() -> list[str]:
                return [m["text"] for m in tg.bot_messages(USER)]

            async with running_gateway(cfg):
                tg.inject_message("/compact", chat_id=USER, user_id=USER)
                await until(lambda: texts(), what="nothing to compact")
                assert texts()[0].startswith("There is no session") or \
                    texts()[0].startswith("Nothing to compact")
                for i, q in enumerate(["when is the first ferry?", "and the tide at noon?",
                                       "is the cafe open?", "thanks, one more thing"]):
                    tg.inject_message(q, chat_id=USER, user_id=USER)
                    await until(lambda i=i: len(chat_requests(model)) == i + 1, what=q)
                    await until(lambda i=i: len(texts()) == i + 2, what="reply")
                model.script_text(SUMMARY)
                tg.inject_message("/compact", chat_id=USER, user_id=USER)
                await until(lambda: any(t.startswith("Compacted this session") for t in
                                        texts()), what="the compaction")
                summary_call = chat_requests(model)[-1]
                assert summary_call["messages"][0]["content"] == SUMMARY_SYSTEM
                assert "first ferry" in json.dumps(summary_call)
                tg.inject_message("what did we talk about?", chat_id=USER, user_id=USER)
                await until(lambda: "what did we talk about" in json.dumps(
                    chat_requests(model)[-1]), what="the next turn")
                after = json.dumps(chat_requests(model)[-1]["messages"])
                assert SUMMARY in after and "first ferry" not in after
            entries = [json.loads(line) for f in (tmp_path / "s").rglob("*.jsonl")
                       if "sessions" in f.parts for line in f.read_text().splitlines()
                       if line.strip()]
            assert any(e.get("type") == "compaction" for e in entries)
        finally:
            await tg.stop()
