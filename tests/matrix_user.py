"""The human side of the Matrix tests: a Matrix user speaking the client-server API over
plain HTTP (aiohttp), so every request the test makes is visible here and nothing of the
adapter (matrix-nio) is reused to check it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any
from urllib.parse import quote

import aiohttp

from tests.synapse_server import MatrixLogin

_txn = itertools.count(1)


class MatrixUser:
    """One logged-in user on the homeserver at ``url``. ``await close()`` at the end."""

    def __init__(self, url: str, login: MatrixLogin) -> None:
        self.url, self.login = url, login
        self.user_id = login.user_id
        self._http: aiohttp.ClientSession | None = None

    async def call(self, method: str, path: str, body: Any = None, *,
                   params: dict[str, str] | None = None, data: bytes | None = None,
                   content_type: str | None = None) -> Any:
        """One request; returns the JSON answer. AssertionError for a non-2xx."""
        if self._http is None:
            self._http = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {self.login.access_token}"}
        if content_type:
            headers["Content-Type"] = content_type
        async with self._http.request(method, f"{self.url}{path}", json=body, data=data,
                                      params=params, headers=headers) as r:
            payload = await r.json(content_type=None) if r.content_type.endswith("json") \
                else await r.read()
            assert r.status < 300, f"{method} {path} -> {r.status}: {payload}"
            return payload

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def create_room(self, *, invite: list[str], direct: bool = False,
                          name: str | None = None) -> str:
        body: dict[str, Any] = {"invite": invite, "is_direct": direct,
                                "preset": "trusted_private_chat" if direct else "private_chat"}
        if name:
            body["name"] = name
        return (await self.call("POST", "/_matrix/client/v3/createRoom", body))["room_id"]

    async def members(self, room_id: str) -> set[str]:
        r = await self.call("GET", f"/_matrix/client/v3/rooms/{quote(room_id)}/joined_members")
        return set(r["joined"])

    async def wait_joined(self, room_id: str, user_id: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while user_id not in await self.members(room_id):
            assert time.monotonic() < deadline, f"{user_id} never joined {room_id}"
            await asyncio.sleep(0.05)

    async def send_event(self, room_id: str, event_type: str, content: dict[str, Any]) -> str:
        path = (f"/_matrix/client/v3/rooms/{quote(room_id)}/send/{event_type}/"
                f"t{next(_txn)}-{uuid.uuid4().hex[:8]}")
        return (await self.call("PUT", path, content))["event_id"]

    async def send(self, room_id: str, body: str, *, mention: str | None = None,
                   thread: str | None = None, reply_to: str | None = None,
                   extra: dict[str, Any] | None = None) -> str:
        """An ``m.text`` message; ``mention``: a user id put in ``m.mentions`` (and the
        body, as clients do); ``thread``: the root event id of a thread."""
        content: dict[str, Any] = {"msgtype": "m.text", "body": body}
        if mention:
            content["body"] = f"{mention}: {body}"
            content["m.mentions"] = {"user_ids": [mention]}
        else:
            content["m.mentions"] = {}
        if thread:
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": thread,
                                       "is_falling_back": True,
                                       "m.in_reply_to": {"event_id": thread}}
        elif reply_to:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
        content.update(extra or {})
        return await self.send_event(room_id, "m.room.message", content)

    async def react(self, room_id: str, event_id: str, key: str) -> str:
        return await self.send_event(room_id, "m.reaction", {"m.relates_to": {
            "rel_type": "m.annotation", "event_id": event_id, "key": key}})

    async def upload(self, data: bytes, name: str, mime: str) -> str:
        r = await self.call("POST", "/_matrix/media/v3/upload", data=data,
                            params={"filename": name}, content_type=mime)
        return r["content_uri"]

    async def download(self, mxc: str) -> bytes:
        server, media_id = mxc.removeprefix("mxc://").split("/", 1)
        return await self.call("GET", f"/_matrix/client/v1/media/download/{server}/{media_id}")

    async def events(self, room_id: str, *, sender: str | None = None,
                     event_type: str | None = None) -> list[dict[str, Any]]:
        """The room's timeline, oldest first (``/messages``, up to 200 events)."""
        r = await self.call("GET", f"/_matrix/client/v3/rooms/{quote(room_id)}/messages",
                            params={"dir": "b", "limit": "200"})
        out = list(reversed(r["chunk"]))
        return [e for e in out if (sender is None or e["sender"] == sender)
                and (event_type is None or e["type"] == event_type)]

    async def messages_from(self, room_id: str, sender: str) -> list[dict[str, Any]]:
        """``m.room.message`` events of ``sender`` that are not edits, oldest first."""
        return [e for e in await self.events(room_id, sender=sender,
                                             event_type="m.room.message")
                if (e.get("content") or {}).get("m.relates_to", {}).get("rel_type")
                != "m.replace" and e.get("content")]

    async def wait_messages(self, room_id: str, sender: str, count: int,
                            timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until ``sender`` posted at least ``count`` messages; returns them."""
        deadline = time.monotonic() + timeout
        while True:
            got = await self.messages_from(room_id, sender)
            if len(got) >= count:
                return got
            assert time.monotonic() < deadline, \
                f"{len(got)} of {count} messages from {sender} after {timeout}s: {got}"
            await asyncio.sleep(0.05)
