"""Media on Slack and Discord through the whole gateway (issue 12 "How it is proven"):
real slack-bolt/slack-sdk and discord.py clients against the fakes (Slack file download
with the bot token, files_upload_v2; Discord attachment URLs and multipart uploads)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from tests.channel_harness import chat_requests, last_user_text, until
from tests.fakes.fake_discord import FakeDiscord
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_slack import FakeSlack
from tests.helpers import base_config, running_gateway
from tests.media_files import image_parts, jpeg, tiny_pdf

pytestmark = pytest.mark.timeout(40)


def _vision(cfg: dict) -> dict:
    cfg["models"]["providers"]["fake"]["models"] = {"fake-model": {"vision": True}}
    return cfg


def slack_config(tmp_path: Path, model: FakeOpenAI, slack: FakeSlack, **media) -> dict:
    section = {"enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
               "api_base_url": slack.api_url, "dm_policy": "open"}
    return _vision(base_config(tmp_path / "state", model.base_url,
                               channels={"slack": section}, media=media))


def discord_config(tmp_path: Path, model: FakeOpenAI, dc: FakeDiscord, **media) -> dict:
    section = {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
               "gateway_url": dc.gateway_url, "dm_policy": "open"}
    return _vision(base_config(tmp_path / "state", model.base_url,
                               channels={"discord": section}, media=media))


def ws(tmp_path: Path) -> Path:
    return tmp_path / "state" / "workspace" / "main"


async def test_slack_photo_and_pdf_in_files_out(tmp_path, model):
    async with FakeSlack() as slack:
        (ws(tmp_path)).mkdir(parents=True)
        (ws(tmp_path) / "plot.png").write_bytes(jpeg(64, 64))
        model.script_text("Nice picture.\nMEDIA: plot.png")
        model.script_text("Read the PDF.")
        async with running_gateway(slack_config(tmp_path, model, slack)):
            photo = slack.add_file("beach.jpg", jpeg(1600, 1200), "image/jpeg")
            await slack.push_event(slack.dm("look", subtype="file_share", files=[photo],
                                            thread_ts=None))
            await until(lambda: slack.uploads, what="the upload")
            pdf = slack.add_file("tides.pdf", tiny_pdf("Low tide 12:40"), "application/pdf")
            await slack.push_event(slack.dm("", subtype="file_share", files=[pdf]))
            await until(lambda: len(chat_requests(model)) == 2, what="second turn")
        first, second = chat_requests(model)
        [img] = image_parts(first)
        with Image.open(io.BytesIO(img)) as seen:
            assert max(seen.size) == 1568
        assert "Low tide 12:40" in last_user_text(second)
        # downloads carried the bot token
        assert {d["auth"] for d in slack.file_downloads} == {f"Bearer {slack.bot_token}"}
        [up] = slack.uploads
        assert up["filename"] == "plot.png" and up["data"] == (ws(tmp_path) /
                                                               "plot.png").read_bytes()
        assert up["channel"] == "D0ALICE"
        assert "Nice picture." in slack.chat_view("D0ALICE")  # streamed: posted, then grown


async def test_slack_thirty_megabyte_file_is_refused(tmp_path, model):
    async with FakeSlack() as slack:
        async with running_gateway(slack_config(tmp_path, model, slack)):
            big = slack.add_file("video.mov", b"x" * 10, "video/quicktime",
                                 size=30 * 1024 * 1024)
            await slack.push_event(slack.dm("", subtype="file_share", files=[big]))
            await until(lambda: slack.messages("D0ALICE"), what="the refusal")
        [notice] = slack.messages("D0ALICE")
        assert "larger than the 20.0 MB limit" in notice["text"]
        assert slack.file_downloads == [] and chat_requests(model) == []


async def test_discord_photo_in_and_message_tool_upload(tmp_path, model):
    dc = FakeDiscord()
    await dc.start()
    try:
        ws(tmp_path).mkdir(parents=True)
        (ws(tmp_path) / "notes.txt").write_text("tide notes\n")
        model.script_tool_call("message", {"media": ["notes.txt"]})
        model.script_text("Sent you the notes.")
        async with running_gateway(discord_config(tmp_path, model, dc)):
            await dc.send_dm_files("what's this?", [("pic.png", jpeg(300, 300), "image/png")])
            await until(lambda: dc.uploads, what="the upload")
            await until(lambda: len(dc.sent_messages()) >= 2, what="the reply")
        first = chat_requests(model)[0]
        [img] = image_parts(first)
        assert img[:3] == b"\xff\xd8\xff"  # sniffed as JPEG whatever the name/type said
        assert "image/jpeg" in last_user_text(first) and dc.file_downloads
        [up] = dc.uploads
        assert up["files"][0]["filename"] == "notes.txt"
        assert up["files"][0]["data"] == b"tide notes\n"
    finally:
        await dc.stop()


async def test_slack_token_is_only_sent_to_slack_file_hosts(tmp_path, model):
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    seen: list[str] = []

    async def steal(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(body=b"x")

    app = web.Application()
    app.router.add_get("/steal", steal)
    other = TestServer(app, host="127.0.0.1")
    await other.start_server()
    try:
        async with FakeSlack() as slack:
            model.script_text("ok")
            async with running_gateway(slack_config(tmp_path, model, slack)):
                evil = {**slack.add_file("a.txt", b"x", "text/plain"),
                        "url_private_download": str(other.make_url("/steal"))}
                await slack.push_event(slack.dm("see file", subtype="file_share",
                                                files=[evil]))
                await until(lambda: slack.messages("D0ALICE"), what="the reply")
        assert seen == []
        assert "a.txt" not in last_user_text(chat_requests(model)[0])
    finally:
        await other.close()
