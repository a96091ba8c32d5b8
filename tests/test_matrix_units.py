"""The Matrix channel's pure pieces without a homeserver: event normalisation (mentions,
threads, edits, reactions, media), the saved sync position, HTML rendering and splitting.
The whole path against a real Synapse is tests/test_gateway_matrix.py."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from channels.matrix.media import download_url
from channels.matrix.normalize import (
    BotIdentity,
    RoomView,
    event_from_event,
    inbound_from_event,
)
from channels.matrix.sync_state import SyncState
from channels.outbound.markup import convert_with_plain
from channels.outbound.render import MATRIX_LIMIT, matrix_length, render_chunks
from runtime.storage.embedded.document_file import DocumentFile

BOT = BotIdentity("@tide:hs", "Tide Bot")
ROOM = "!room:hs"


def view(*, dm: bool = False, sent: tuple[str, ...] = ()) -> RoomView:
    return RoomView(ROOM, dm, {"@alice:hs": "Alice"}, set(sent).__contains__)


def message(body: str, **content) -> dict:
    return {"type": "m.room.message", "sender": "@alice:hs", "event_id": "$e1",
            "content": {"msgtype": "m.text", "body": body, **content}}


def inbound(event: dict, room: RoomView | None = None):
    return inbound_from_event(event, room or view(), BOT, account_id="default",
                              received_at=1.0, fetcher=lambda url, name: None)


def test_mentions_intentional_id_name_and_replies():
    assert inbound(message("hi", **{"m.mentions": {"user_ids": ["@tide:hs"]}})).mentions_bot
    assert inbound(message("ask @tide:hs please")).mentions_bot
    assert inbound(message("tide bot, what now?")).mentions_bot  # no m.mentions: the name
    # a client that sends m.mentions without the bot: the name alone is not a mention
    assert not inbound(message("Tide Bot is nice", **{"m.mentions": {}})).mentions_bot
    reply = message("yes", **{"m.relates_to": {"m.in_reply_to": {"event_id": "$bot"}}})
    assert inbound(reply, view(sent=("$bot",))).mentions_bot
    assert not inbound(reply).mentions_bot


def test_a_leading_mention_is_removed_from_the_text():
    msg = inbound(message("Tide Bot: when is high water?",
                          **{"m.mentions": {"user_ids": ["@tide:hs"]}}))
    assert msg.text == "when is high water?"
    assert inbound(message("@tide:hs what now")).text == "what now"
    assert inbound(message("no mention here")).text == "no mention here"


def test_rooms_threads_and_dms():
    group = inbound(message("hello"))
    assert (group.chat_type, group.group_id, group.thread_id, group.peer_id) == (
        "group", ROOM, None, "@alice:hs")
    rel = {"m.relates_to": {"rel_type": "m.thread", "event_id": "$root",
                            "is_falling_back": True, "m.in_reply_to": {"event_id": "$root"}}}
    thread = inbound(message("in a thread", **rel))
    assert (thread.chat_type, thread.thread_id, thread.reply_to) == ("thread", "$root", None)
    dm = inbound(message("in a dm thread", **rel), view(dm=True))
    assert (dm.chat_type, dm.group_id, dm.thread_id) == ("dm", None, "$root")


def test_own_messages_and_edits_start_no_turn_and_edits_reactions_become_events():
    own = {**message("me"), "sender": "@tide:hs"}
    assert inbound(own) is None and event_from_event(own, view(), BOT,
                                                      account_id="default") is None
    edit = message("* fixed", **{"m.new_content": {"msgtype": "m.text", "body": "fixed"},
                                 "m.relates_to": {"rel_type": "m.replace", "event_id": "$e0"}})
    assert inbound(edit) is None
    event = event_from_event(edit, view(), BOT, account_id="default")
    assert event.kind == "edit" and "fixed" in event.text and event.group_id == ROOM
    reaction = {"type": "m.reaction", "sender": "@alice:hs", "event_id": "$r", "content": {
        "m.relates_to": {"rel_type": "m.annotation", "event_id": "$e0", "key": "👍"}}}
    event = event_from_event(reaction, view(dm=True), BOT, account_id="default")
    assert (event.kind, event.chat_type, event.peer_id) == ("reaction", "dm", "@alice:hs")
    assert event.text == "Alice reacted 👍 to message $e0"


def test_media_messages_carry_their_mxc_file():
    image = message("beach.jpg", msgtype="m.image", url="mxc://hs/abc",
                    info={"mimetype": "image/jpeg", "size": 10})
    msg = inbound(image)
    [media] = msg.media
    assert (media.kind, media.name, media.size, media.handle) == (
        "image", "beach.jpg", 10, "mxc://hs/abc")
    assert msg.text == ""  # the body is the file name, not a caption
    captioned = inbound(message("look at this", msgtype="m.file", filename="a.txt",
                                url="mxc://hs/def"))
    assert captioned.text == "look at this" and captioned.media[0].kind == "document"
    # an encrypted attachment (``file`` instead of ``url``) is not readable: no message
    assert inbound(message("secret.png", msgtype="m.image", file={"url": "mxc://x/y"})) is None
    assert download_url("http://hs/", "mxc://hs/abc") == (
        "http://hs/_matrix/client/v1/media/download/hs/abc")
    with pytest.raises(ValueError):
        download_url("http://hs", "https://elsewhere/abc")


def test_sync_state_survives_a_restart_and_a_corrupt_one_disables_only_itself(tmp_path):
    path = tmp_path / "matrix-default-sync.json"
    state = SyncState(DocumentFile(path))
    state.load()
    assert state.next_batch is None
    state.add_direct("!dm:hs", "@alice:hs")
    state.save("s42_1")
    again = SyncState(DocumentFile(path))
    again.load()
    assert (again.next_batch, again.room_of("@alice:hs")) == ("s42_1", "!dm:hs")
    path.write_text('{"next_batch": 7}')
    with capture_logs() as logs:
        broken = SyncState(DocumentFile(path))
        broken.load()
    assert broken.next_batch is None
    [entry] = [r for r in logs if r["event"] == "state_file_corrupt"]
    assert entry["owner"] == "matrix sync position"
    assert any(p.name.startswith(path.name + ".corrupt") for p in tmp_path.iterdir())


def test_html_is_escaped_and_room_mentions_defused():
    html, plain = convert_with_plain("**hi** <b>x</b> @room", "matrix")
    assert html == "<p><strong>hi</strong> &lt;b&gt;x&lt;/b&gt; @\u200broom</p>"
    assert plain == "hi <b>x</b> @\u200broom"


def test_parts_fit_the_limit_also_for_non_ascii_text():
    text = "\n\n".join("潮汐" * 300 + f" {i}" for i in range(20))  # 12,000+ CJK characters
    parts = render_chunks(text, "matrix")
    assert len(parts) > 3
    for p in parts:
        assert matrix_length(p.formatted) <= MATRIX_LIMIT
        assert len(json.dumps(p.formatted)) <= 4 * MATRIX_LIMIT + 8
