"""Matrix against a real Synapse (tests/synapse_server.py, shared with
tests/test_gateway_matrix.py), matrix-nio in the adapter, and a second Matrix user over
plain HTTP (tests/matrix_user.py) as the human.

The readers are synchronous, so the human keeps its own ``/sync`` loop running in the
background and the readers look at what it has seen: the bot's messages with their
latest ``m.replace`` edit applied and redacted ones left out, the files it uploaded
(downloaded as they appear). The outage stops and starts the Synapse process.

A homeserver hands an event to a sync loop once: it is redelivered only when the
adapter's sync position was not saved after it (a crash). ``redeliver`` plays that
case: it fetches the event as the homeserver stores it and hands it to the running
adapter's inbound path, exactly as the re-read sync response would.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import html
import json
import re
from typing import Any

from gateway.routing import normalize_id
from tests.conformance.driver import ChannelDriver
from tests.matrix_user import MatrixUser
from tests.synapse_server import shared_synapse

_TAG = re.compile(r"<[^>]+>")
_BREAK = re.compile(r"<br\s*/?>|</p>|</li>|</h\d>|</pre>|</blockquote>")


class MatrixDriver(ChannelDriver):
    name = "matrix"
    limit = 4000
    streams = True

    async def start(self) -> None:
        self.server = await asyncio.to_thread(shared_synapse)
        self.bot = await asyncio.to_thread(self.server.register, "conformbot")
        login = await asyncio.to_thread(self.server.register, "conformalice")
        self.alice = MatrixUser(self.server.url, login)
        self.dm_room = await self.alice.create_room(invite=[self.bot.user_id], direct=True)
        self.group_room = await self.alice.create_room(invite=[self.bot.user_id],
                                                       name="conformance")
        self.dm_key = f"agent:main:matrix:dm:{normalize_id(login.user_id, case_sensitive=True)}"
        self.group_key = ("agent:main:matrix:group:"
                          f"{normalize_id(self.group_room, case_sensitive=True)}")
        self.timeline: dict[str, list[dict[str, Any]]] = {}
        self.files: dict[str, bytes] = {}
        self._syncing = asyncio.create_task(self._sync_loop())

    async def stop(self) -> None:
        self._syncing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._syncing
        await self.alice.close()

    async def _sync_loop(self) -> None:
        since: str | None = None
        flt = json.dumps({"room": {"timeline": {"limit": 200}}})
        while True:
            try:
                params = {"filter": flt, "timeout": "500"}
                if since:
                    params["since"] = since
                r = await self.alice.call("GET", "/_matrix/client/v3/sync", params=params)
                for room_id, info in (r.get("rooms") or {}).get("join", {}).items():
                    for event in info.get("timeline", {}).get("events", []):
                        self.timeline.setdefault(room_id, []).append(event)
                        await self._keep_file(event)
                since = r["next_batch"]
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the homeserver is down (an outage): retry
                await asyncio.sleep(0.2)

    async def _keep_file(self, event: dict[str, Any]) -> None:
        url = (event.get("content") or {}).get("url")
        if event.get("sender") == self.bot.user_id and isinstance(url, str):
            self.files[event["event_id"]] = await self.alice.download(url)

    def section(self, **overrides: Any) -> dict[str, Any]:
        return {"enabled": True, "homeserver": self.server.url, "user_id": self.bot.user_id,
                "access_token": self.bot.access_token, "dm_policy": "open",
                "groups": [self.group_room], "streaming": "off", "sync_timeout": "5s",
                "reconnect_max": "0.5s", **overrides}

    async def dm(self, text: str) -> Any:
        return self.dm_room, await self.alice.send(self.dm_room, text)

    async def group(self, text: str, *, mention: bool) -> Any:
        event_id = await self.alice.send(self.group_room, text,
                                         mention=self.bot.user_id if mention else None)
        return self.group_room, event_id

    async def dm_file(self, text: str, name: str, data: bytes, mime: str) -> Any:
        mxc = await self.alice.upload(data, name, mime)
        event_id = await self.alice.send_event(self.dm_room, "m.room.message", {
            "msgtype": "m.file", "body": text, "filename": name, "url": mxc,
            "info": {"mimetype": mime, "size": len(data)}})
        return self.dm_room, event_id

    async def redeliver(self, handle: Any) -> None:
        from channels.matrix.adapter import MatrixChannel
        room, event_id = handle
        event = await self.alice.call("GET", f"/_matrix/client/v3/rooms/{room}/event/"
                                      f"{event_id}")
        [adapter] = [o for o in gc.get_objects() if isinstance(o, MatrixChannel)
                     and o.state == "connected"]
        await adapter._dispatch(room, event)

    # -- what the bot posted --------------------------------------------------------------
    def _bot_messages(self, room: str) -> list[dict[str, Any]]:
        events = self.timeline.get(room, [])
        redacted = {e.get("redacts") or (e.get("content") or {}).get("redacts")
                    for e in events if e["type"] == "m.room.redaction"}
        latest: dict[str, dict[str, Any]] = {}
        out = []
        for e in events:
            if e["type"] != "m.room.message" or e["sender"] != self.bot.user_id:
                continue
            rel = (e.get("content") or {}).get("m.relates_to") or {}
            if rel.get("rel_type") == "m.replace":
                latest[rel["event_id"]] = e["content"]["m.new_content"]
            elif e["event_id"] not in redacted and e.get("content"):
                out.append(e)
        return [{**e, "content": latest.get(e["event_id"], e["content"])} for e in out]

    def _texts(self, room: str) -> list[str]:
        return [m["content"].get("formatted_body") or m["content"]["body"]
                for m in self._bot_messages(room) if m["content"].get("msgtype") == "m.text"]

    def dm_texts(self) -> list[str]:
        return self._texts(self.dm_room)

    def group_texts(self) -> list[str]:
        return self._texts(self.group_room)

    def plain(self, text: str) -> str:
        return html.unescape(_TAG.sub("", _BREAK.sub("\n", text))).strip("\n")

    def length(self, text: str) -> int:
        # characters, or a quarter of the escaped JSON bytes the event carries
        return max(len(text), (len(json.dumps(text)) - 2) // 4)

    def dm_uploads(self) -> list[tuple[str, bytes]]:
        return [(m["content"]["body"], self.files[m["event_id"]])
                for m in self._bot_messages(self.dm_room)
                if m["content"].get("url") and m["event_id"] in self.files]

    def edit_count(self) -> int:
        return sum(1 for events in self.timeline.values() for e in events
                   if e["type"] == "m.room.message" and e["sender"] == self.bot.user_id
                   and ((e.get("content") or {}).get("m.relates_to") or {}).get("rel_type")
                   == "m.replace")

    async def outage(self, down: bool) -> None:
        await asyncio.to_thread(self.server.stop if down else self.server.start)


DRIVER = MatrixDriver()
