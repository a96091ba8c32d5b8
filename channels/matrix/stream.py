"""Matrix's stream sender for channels/outbound/streaming.py: a streamed reply is posted
once and then edited in place with ``m.replace`` events (spec: event replacements), each
carrying the whole new text in ``m.new_content`` (clients show the latest). A discarded
part is redacted. Parts after the first and edits keep the thread relation of the
reply; edits never carry one of their own (the spec forbids it in ``m.new_content``).
"""

from __future__ import annotations

import html
import re
from typing import Any

from channels.base import OutboundMessage
from channels.matrix.send import put_event, refusal, relates_to, text_content

_TAG = re.compile(r"<[^>]+>")
_BREAK = re.compile(r"<br\s*/?>|</p>|</li>|</h\d>|</pre>|</blockquote>")


def plain_of_html(text: str) -> str:
    """The plain ``body`` twin of a rendered HTML part (tags dropped, entities decoded)."""
    return html.unescape(_TAG.sub("", _BREAK.sub("\n", text))).strip("\n")


class MatrixStream:
    """The messages of one streamed reply into room ``room_id``. ``on_sent(event_id)`` is
    told of every event the bot posts (so replies to it count as mentions)."""

    platform = "matrix"

    def __init__(self, client: Any, room_id: str, message: OutboundMessage,
                 on_sent: Any = None) -> None:
        self.client, self.room_id, self.message = client, room_id, message
        self.on_sent = on_sent
        self.ids: dict[int, str] = {}
        self.texts: dict[int, str] = {}
        self.edits = 0

    def _content(self, text: str, formatted: bool) -> dict[str, Any]:
        # the streaming loop hands formatted (HTML) or plain text; the body is plain
        if formatted:
            return text_content(plain_of_html(text), text)
        return text_content(text, None)

    async def show(self, index: int, text: str, *, formatted: bool, final: bool) -> None:
        if self.texts.get(index) == text:
            return
        content = self._content(text, formatted)
        if index in self.ids:
            edit = {**content, "body": "* " + content["body"], "m.new_content": content,
                    "m.relates_to": {"rel_type": "m.replace", "event_id": self.ids[index]}}
            if "formatted_body" in content:
                edit["formatted_body"] = "* " + content["formatted_body"]
            await put_event(self.client, self.room_id, "m.room.message", edit)
            self.edits += 1
        else:
            rel = relates_to(self.message, index)
            if rel:
                content["m.relates_to"] = rel
            event_id = await put_event(self.client, self.room_id, "m.room.message", content)
            self.ids[index] = event_id
            if self.on_sent is not None:
                self.on_sent(event_id)
        self.texts[index] = text

    async def discard(self, index: int) -> None:
        self.texts.pop(index, None)
        event_id = self.ids.pop(index, None)
        if event_id is not None:
            from nio import RoomRedactResponse
            resp = await self.client.room_redact(self.room_id, event_id)
            if not isinstance(resp, RoomRedactResponse):
                raise refusal(resp)
