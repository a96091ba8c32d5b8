"""A config reload (SIGHUP / control API) rebuilds the media and MCP settings (issue 12):
media limits and the transcriber apply to the next message; MCP servers that were added
start, removed ones stop (their tools and processes gone), changed ones restart, and
unchanged ones keep their connection."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway.config.load import parse_config
from tests.channel_harness import chat_requests, last_user_text, until
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import running_gateway
from tests.media_files import ogg_voice
from tests.test_mcp import SERVER, alive, cfg_with, pids, tool_names
from tests.test_media_telegram import USER, config, notices

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]


async def test_reload_applies_media_limits_and_transcription(tmp_path):
    tg = await FakeTelegram().start()
    try:
        async with FakeOpenAI() as model:
            model.script_text("Got the file.")
            model.script_text("Got the voice note.")
            cfg = config(tmp_path, model, tg)
            async with running_gateway(cfg) as gw:
                tg.inject_media("document", b"y" * 1_500_000, chat_id=USER, user_id=USER,
                                file_name="big.bin")
                await until(lambda: notices(tg) == ["Got the file."], what="the reply")
                new = {**cfg, "media": {**cfg["media"], "max_bytes": 1_000_000,
                                        "audio": {"transcription": {"provider": "fake"}}}}
                assert await gw.reload(parse_config(new, "test", env={})) == []
                tg.inject_media("document", b"z" * 1_500_000, chat_id=USER, user_id=USER,
                                file_name="bigger.bin")
                await until(lambda: len(notices(tg)) == 2, what="the refusal")
                assert "bigger.bin" in notices(tg)[1]
                assert "larger than the 976.6 KB limit" in notices(tg)[1]
                tg.inject_media("voice", ogg_voice(), chat_id=USER, user_id=USER)
                await until(lambda: len(notices(tg)) == 3, what="the voice reply")
            assert len(model.transcriptions) == 1  # the reloaded transcriber was used
            assert "[transcribed voice message]" in last_user_text(chat_requests(model)[-1])
            assert not [t for t in notices(tg) if "transcription is not set up" in t]
    finally:
        await tg.stop()


def _server(pid_file: Path, **extra) -> dict:
    return {"command": sys.executable, "args": [SERVER],
            "env": {"MCP_PID_FILE": str(pid_file), **extra}}


async def test_reload_adds_removes_and_restarts_mcp_servers(tmp_path):
    a, b = tmp_path / "a.pids", tmp_path / "b.pids"
    async with FakeOpenAI() as model:
        for _ in range(3):
            model.script_text("ok")
        cfg = cfg_with(tmp_path, model, {"tides": _server(a)})
        async with running_gateway(cfg) as gw:
            await gw.local.send("one")
            [first] = pids(a)
            assert "mcp__tides__tide" in tool_names(chat_requests(model)[-1])

            # add "coast", change "tides" (its env): tides restarts, coast starts
            cfg2 = {**cfg, "mcp": {"servers": {"tides": _server(a, EXTRA="1"),
                                               "coast": _server(b)}}}
            await gw.reload(parse_config(cfg2, "test", env={}))
            assert gw.mcp.status()["coast"]["state"] == "connected"
            assert gw.mcp.status()["tides"]["state"] == "connected"
            await until(lambda: not alive(first), timeout=10, what="the old tides process")
            assert len(pids(a)) == 2 and len(pids(b)) == 1
            await gw.local.send("two")
            names = tool_names(chat_requests(model)[-1])
            assert {"mcp__tides__tide", "mcp__coast__tide"} <= set(names)

            # unchanged config: nothing restarts
            await gw.reload(parse_config(cfg2, "test", env={}))
            assert len(pids(a)) == 2 and len(pids(b)) == 1

            # remove "tides": its process ends and its tools are gone
            cfg3 = {**cfg, "mcp": {"servers": {"coast": _server(b)}}}
            await gw.reload(parse_config(cfg3, "test", env={}))
            await until(lambda: not alive(pids(a)[-1]), timeout=10, what="tides to exit")
            assert "tides" not in gw.mcp.status()
            await gw.local.send("three")
            names = tool_names(chat_requests(model)[-1])
            assert "mcp__coast__tide" in names
            assert not [n for n in names if n.startswith("mcp__tides__")]
            coast = pids(b)[-1]
            assert alive(coast) and len(pids(b)) == 1
        await until(lambda: not alive(coast), timeout=10, what="coast to exit at shutdown")
