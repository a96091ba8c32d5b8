"""``/verbose`` tool progress (issue 13 "Streamed replies"): a verbose session's turn
shows one status line edited in place while tools run ("🔧 read notes.md") and keeps a
summary when it ends; ``/verbose off`` stops it; the setting is in the session entry and
``channels.<p>.tool_progress`` is the default — the real python-telegram-bot against the
fake Bot API."""

from __future__ import annotations

import pytest

from gateway.outbound.tool_progress import tool_label
from tests.channel_harness import chat_requests, sessions_with, until
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER, GROUP = 4242, -1001234567890
KEY = f"agent:main:telegram:group:{GROUP}"


def config(tmp_path, model, tg, **extra) -> dict:
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "groups": [str(GROUP)],
               "require_mention": False,
               "streaming": {"mode": "off", "min_interval": 0.05}, **extra}
    return base_config(tmp_path / "s", model.base_url, channels={"telegram": section})


def script_two_tools(model) -> None:
    model.script_tool_call("read", {"path": "notes.md"})
    model.script_tool_call("exec", {"command": "echo ok"})
    model.script_text("All green.")


def texts(tg) -> list[str]:
    return tg.chat_view(GROUP)


def test_label_picks_the_telling_argument():
    assert tool_label("read", {"path": "notes.md"}) == "read notes.md"
    assert tool_label("exec", '{"command": "pytest  -q\\n"}') == "exec pytest -q"
    assert tool_label("memory_search", {"limit": 3}) == "memory_search"
    assert len(tool_label("web_fetch", {"url": "https://x.example/" + "a" * 90})) == 60


async def test_verbose_shows_an_edited_status_line_then_off(tmp_path):
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            async with running_gateway(config(tmp_path, model, tg)) as gw:
                tg.inject_message("/verbose on", chat_id=GROUP, user_id=USER)
                await until(lambda: any("Tool progress on" in t for t in texts(tg)),
                            what="the confirmation")
                script_two_tools(model)
                tg.inject_message("run the tests", chat_id=GROUP, user_id=USER)
                await until(lambda: "All green." in texts(tg), what="the reply")
                await until(lambda: "🔧 read notes.md · exec echo ok" in texts(tg),
                            what="the summary line")
                edits = [s["payload"]["text"] for s in tg.sent
                         if s["method"] == "editMessageText"]
                assert edits and edits[-1] == "🔧 read notes.md · exec echo ok"
                first = [s["payload"]["text"] for s in tg.sent if s["method"] == "sendMessage"
                         and s["payload"]["text"].startswith("🔧")]
                assert first == ["🔧 read notes.md"]  # one status message, edited in place
                assert gw.agents["main"].store.get(KEY).verbose is True
                tg.inject_message("/verbose off", chat_id=GROUP, user_id=USER)
                await until(lambda: any("Tool progress off" in t for t in texts(tg)),
                            what="off")
                script_two_tools(model)
                before = len([t for t in texts(tg) if t.startswith("🔧")])
                tg.inject_message("again", chat_id=GROUP, user_id=USER)
                await until(lambda: texts(tg).count("All green.") == 2, what="reply 2")
                assert len([t for t in texts(tg) if t.startswith("🔧")]) == before
                assert len(chat_requests(model)) == 6
            on_disk = await sessions_with(tmp_path / "s", KEY)
            assert on_disk[KEY]["verbose"] is False
        finally:
            await tg.stop()


async def test_tool_progress_default_from_config(tmp_path):
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            async with running_gateway(config(tmp_path, model, tg, tool_progress=True)):
                script_two_tools(model)
                tg.inject_message("run the tests", chat_id=GROUP, user_id=USER)
                await until(lambda: "🔧 read notes.md · exec echo ok" in texts(tg)
                            and "All green." in texts(tg), what="summary and reply")
        finally:
            await tg.stop()
