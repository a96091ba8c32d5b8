"""Matrix through the whole gateway: the real gateway in-process, the real MatrixChannel
(matrix-nio) against a real Synapse homeserver (tests/synapse_server.py: SQLite, a free
port, users registered with the admin API), a second Matrix user over plain HTTP as the
human (tests/matrix_user.py), and the fake OpenAI model.

Synapse starts once per test process (shared with the Matrix conformance driver,
tests/conformance/drivers/matrix.py, which also covers streaming edits and a homeserver
outage); every test has its own gateway state dir and its own rooms, so the bot's first
sync of each test skips what earlier tests left behind.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.channels.boot import APPROVED_TEXT
from tests.channel_harness import (
    chat_requests,
    last_user_text,
    log_events,
    run_cli,
    sessions_with,
    write_config,
)
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway
from tests.matrix_user import MatrixUser
from tests.media_files import image_parts, jpeg
from tests.synapse_server import MatrixLogin, SynapseMissing, SynapseServer, shared_synapse

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def synapse() -> SynapseServer:
    try:
        return shared_synapse()  # one per test process (the conformance driver's too)
    except SynapseMissing as exc:
        pytest.fail(str(exc))  # a missing Synapse is a failure, never a skip


@pytest.fixture(scope="module")
def bot(synapse: SynapseServer) -> MatrixLogin:
    return synapse.register("tidebot")


@pytest.fixture(scope="module")
def alice_login(synapse: SynapseServer) -> MatrixLogin:
    return synapse.register("alice")


@pytest.fixture
async def alice(synapse: SynapseServer, alice_login: MatrixLogin):
    user = MatrixUser(synapse.url, alice_login)
    yield user
    await user.close()


def config(tmp_path: Path, model: FakeOpenAI, synapse: SynapseServer, bot: MatrixLogin,
           **section: Any) -> dict:
    matrix = {"enabled": True, "homeserver": synapse.url, "user_id": bot.user_id,
              "access_token": bot.access_token, "dm_policy": "open",
              "streaming": "off", "sync_timeout": "5s", **section}
    return base_config(tmp_path / "state", model.base_url, channels={"matrix": matrix},
                       messages={"typing_interval": "0.2s"})


async def dm_room(alice: MatrixUser, bot: MatrixLogin) -> str:
    room = await alice.create_room(invite=[bot.user_id], direct=True)
    await alice.wait_joined(room, bot.user_id)
    return room


async def test_dm_conversation_with_typing_and_reactions(tmp_path, model, synapse, bot,
                                                         alice):
    model.script_text("Hi there, **friend**!", delay=0.5)
    model.script_text("Noted.")
    cfg = config(tmp_path, model, synapse, bot)
    cfg["messages"].update({"ack_reaction_scope": "all", "done_reaction": "✅"})
    with capture_logs() as logs:
        async with running_gateway(cfg) as gw:
            room = await dm_room(alice, bot)
            first = await alice.send(room, "hello bot")
            [reply] = await alice.wait_messages(room, bot.user_id, 1)
            assert reply["content"]["body"] == "Hi there, friend!"
            assert reply["content"]["formatted_body"] == "<p>Hi there, <strong>friend</strong>!</p>"
            assert reply["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == first
            reactions = await until_events(alice, room, bot.user_id, "m.reaction")
            assert {r["content"]["m.relates_to"]["key"] for r in reactions} >= {"✅"}
            await alice.react(room, reply["event_id"], "👍")
            await alice.send(room, "and another thing")
            await alice.wait_messages(room, bot.user_id, 2)
            key = f"agent:main:matrix:dm:{escape(alice.user_id)}"
            await sessions_with(gw.state_dir, key)
            assert gw.status()["channels"]["matrix"]["state"] == "connected"
    first_req, second_req = chat_requests(model)
    assert last_user_text(first_req).endswith("hello bot")
    assert "reacted 👍" in json.dumps(second_req, ensure_ascii=False)
    assert log_events(logs, "matrix_invite_accepted", direct=True)


def escape(user_id: str) -> str:
    from gateway.routing import normalize_id
    return normalize_id(user_id, case_sensitive=True)


async def until_events(user: MatrixUser, room: str, sender: str, event_type: str,
                       timeout: float = 8.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        got = [e for e in await user.events(room, sender=sender, event_type=event_type)
               if e.get("content")]
        if got or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.05)


async def test_room_mention_gating_threads_and_refused_invite(tmp_path, model, synapse, bot,
                                                              alice):
    room = await alice.create_room(invite=[bot.user_id], name="tides")
    other = await alice.create_room(invite=[bot.user_id], name="not allowed")
    with capture_logs() as logs:
        async with running_gateway(config(tmp_path, model, synapse, bot,
                                          groups=[room])) as gw:
            await alice.wait_joined(room, bot.user_id)
            await alice.send(room, "just chatting, not for the bot")
            asked = await alice.send(room, "what's the tide today?", mention=bot.user_id)
            [answer] = await alice.wait_messages(room, bot.user_id, 1)
            assert answer["content"]["body"].endswith("what's the tide today?")
            [denied] = log_events(logs, "inbound_denied", reason="mention_required")
            assert denied["group_id"] == room
            await alice.send(room, "and a reply to the bot", reply_to=answer["event_id"])
            await alice.wait_messages(room, bot.user_id, 2)
            await alice.send(room, "thread question", thread=asked, mention=bot.user_id)
            replies = await alice.wait_messages(room, bot.user_id, 3)
            rel = replies[2]["content"]["m.relates_to"]
            assert rel["rel_type"] == "m.thread" and rel["event_id"] == asked
            group = f"agent:main:matrix:group:{escape(room)}"
            thread = f"{group}:thread:{escape(asked)}"
            on_disk = await sessions_with(gw.state_dir, group, thread)
            assert on_disk[group]["session_id"] != on_disk[thread]["session_id"]
    assert len(chat_requests(model)) == 3
    [refused] = log_events(logs, "matrix_invite_refused", room_id=other)
    assert refused["reason"] == "group_not_allowed"
    assert bot.user_id not in await alice.members(other)


async def test_media_in_and_out(tmp_path, model, synapse, bot, alice):
    cfg = config(tmp_path, model, synapse, bot)
    cfg["models"]["providers"]["fake"]["models"] = {"fake-model": {"vision": True}}
    workspace = tmp_path / "state" / "workspace" / "main"
    workspace.mkdir(parents=True)
    (workspace / "plot.png").write_bytes(jpeg(64, 64))
    model.script_text("Nice picture.\nMEDIA: plot.png")
    async with running_gateway(cfg):
        room = await dm_room(alice, bot)
        photo = jpeg(300, 200)
        mxc = await alice.upload(photo, "beach.jpg", "image/jpeg")
        await alice.send_event(room, "m.room.message", {
            "msgtype": "m.image", "body": "beach.jpg", "url": mxc,
            "info": {"mimetype": "image/jpeg", "size": len(photo)}})
        replies = await alice.wait_messages(room, bot.user_id, 2)
    [img] = image_parts(chat_requests(model)[0])
    assert img[:3] == b"\xff\xd8\xff"
    text, image = replies
    assert text["content"]["body"] == "Nice picture."
    assert image["content"]["msgtype"] == "m.image"
    assert image["content"]["body"] == "plot.png"
    assert await alice.download(image["content"]["url"]) == (workspace / "plot.png").read_bytes()


@pytest.mark.parametrize("storage", ["embedded", "postgres"])
async def test_restart_without_replay_or_gap(tmp_path, model, synapse, bot, alice, storage,
                                             request):
    for text in ("one", "two", "three", "four"):
        model.script_text(f"answer {text}")
    cfg = config(tmp_path, model, synapse, bot, timeline_limit=2)
    if storage == "postgres":
        cfg["storage"] = {"backend": "postgres", "dsn": request.getfixturevalue("pg_dsn")}
    async with running_gateway(cfg) as gw:
        room = await dm_room(alice, bot)
        await alice.send(room, "one")
        await alice.wait_messages(room, bot.user_id, 1)
        saved = None
        while storage == "postgres" and saved is None:  # written off the event loop
            saved = await gw.pg.fetchval("SELECT body FROM state_documents WHERE name = $1",
                                         "matrix/default/sync.json")
            await asyncio.sleep(0.02)
    path = tmp_path / "state" / "channels" / "matrix-default-sync.json"
    if storage == "postgres":  # the shared store holds it, no file
        assert not path.exists() and saved is not None
    else:
        saved = path.read_bytes()
    assert json.loads(bytes(saved))["direct_rooms"] == {room: alice.user_id}
    for text in ("two", "three", "four"):  # more than timeline_limit while down
        await alice.send(room, text)
    with capture_logs() as logs:
        async with running_gateway(cfg):
            replies = await alice.wait_messages(room, bot.user_id, 4)
    assert [r["content"]["body"] for r in replies] == [
        "answer one", "answer two", "answer three", "answer four"]
    asked = [last_user_text(r) for r in chat_requests(model)]
    assert len(asked) == 4 and [a.rsplit(None, 1)[-1] for a in asked] == [
        "one", "two", "three", "four"]
    assert log_events(logs, "matrix_gap_read_back", room_id=room)


async def test_pairing_a_matrix_user_with_the_cli(tmp_path, model, synapse, bot, alice):
    cfg = config(tmp_path, model, synapse, bot, dm_policy="pairing")
    path = write_config(tmp_path, cfg)
    async with running_gateway(cfg):
        room = await dm_room(alice, bot)  # pairing accepts the DM invite: the code goes there
        await alice.send(room, "hi, who are you?")
        [notice] = await alice.wait_messages(room, bot.user_id, 1)
        code = notice["content"]["body"].split("pairing code is ")[1].split(".")[0]
        assert f"tidegate pairing approve matrix {code}" in notice["content"]["body"]
        assert chat_requests(model) == []
        rc, out, err = await run_cli(path, "pairing", "approve", "matrix", code)
        assert rc == 0 and f"approved matrix sender {alice.user_id}" in out, err
        greeting = (await alice.wait_messages(room, bot.user_id, 2))[1]
        assert greeting["content"]["body"] == APPROVED_TEXT  # sent to the user's DM room
        await alice.send(room, "now may I ask?")
        answer = (await alice.wait_messages(room, bot.user_id, 3))[2]
        assert answer["content"]["body"] == "echo: now may I ask?"
