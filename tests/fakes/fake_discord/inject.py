"""What users do, dispatched to the bot over the gateway: DMs, guild messages, attachments,
threads, reactions, edits, deletions."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.fakes.fake_discord.wire import MESSAGE_CONTENT_INTENT, FakeUser, Session, now_iso


class Injection:
    """Mixed into ``FakeDiscord`` (tests/fakes/fake_discord/__init__.py), whose fields it
    uses."""



    async def dispatch(self, event: str, data: Any) -> int:
        """Send one DISPATCH to every live session (kept in its buffer for a RESUME, sent
        at once to its connection if it has one); returns how many connections got it."""
        if event == "MESSAGE_CREATE" and isinstance(data, dict) and "id" in data:
            self.messages[str(data["id"])] = data  # so replies can reference it
        n = 0
        for session in list(self._sessions.values()):
            frame = self._record(session, event, self._filter_content(session, event, data))
            conn = session.conn
            if conn is None or not conn.ready or conn.ws.closed:
                continue
            try:
                await conn.ws.send_str(json.dumps(frame))
                n += 1
            except ConnectionError:
                self._conns.discard(conn)
        return n

    def _filter_content(self, conn: Session, event: str, data: Any) -> Any:
        # Discord blanks content without the privileged intent, except DMs, the bot's own
        # messages and messages that mention the bot.
        if event not in ("MESSAGE_CREATE", "MESSAGE_UPDATE") or not isinstance(data, dict):
            return data
        if conn.intents & MESSAGE_CONTENT_INTENT or "guild_id" not in data:
            return data
        author = (data.get("author") or {}).get("id")
        mentioned = any(m.get("id") == self.bot.id for m in data.get("mentions") or [])
        if author == self.bot.id or mentioned:
            return data
        return {**data, "content": "", "embeds": [], "attachments": []}

    async def send_dm(self, text: str, *, user: FakeUser | None = None,
                      message_id: str | None = None) -> dict[str, Any]:
        """A user DMs the bot. Returns the payload dispatched."""
        user = user or self.alice
        d = self.message_payload(text, author=user, channel_id=self.dm_channel_for(user),
                                 guild=False, message_id=message_id)
        await self.dispatch("MESSAGE_CREATE", d)
        return d

    def attachment(self, channel_id: str, filename: str, data: bytes,
                   content_type: str | None = None) -> dict[str, Any]:
        """An attachment object whose ``url`` this fake serves (like Discord's CDN)."""
        aid = self.new_id()
        path = f"{channel_id}/{aid}/{filename}"
        self.files[path] = data
        return {"id": aid, "filename": filename, "size": len(data),
                "url": f"{self.url}/attachments/{path}",
                "proxy_url": f"{self.url}/attachments/{path}",
                **({"content_type": content_type} if content_type else {})}

    async def send_dm_files(self, text: str, files: list[tuple[str, bytes, str]], *,
                            user: FakeUser | None = None) -> dict[str, Any]:
        """A DM with attachments ``(filename, bytes, content_type)``."""
        user = user or self.alice
        cid = self.dm_channel_for(user)
        d = self.message_payload(text, author=user, channel_id=cid, guild=False)
        d["attachments"] = [self.attachment(cid, n, b, t) for n, b, t in files]
        await self.dispatch("MESSAGE_CREATE", d)
        return d

    async def _attachment_file(self, request: web.Request) -> web.StreamResponse:
        self.file_downloads.append(request.match_info["tail"])
        data = self.files.get(request.match_info["tail"])
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, content_type="application/octet-stream")

    async def send_guild(self, text: str, *, user: FakeUser | None = None,
                         channel_id: str | None = None, mention: bool = False,
                         role_mention: bool = False, reply_to_bot: bool = False,
                         message_id: str | None = None) -> dict[str, Any]:
        """A message in a guild channel (or thread: pass ``channel_id=fake.thread_id``).
        ``mention`` prefixes ``<@BOTID>``; ``role_mention`` uses the bot's managed role;
        ``reply_to_bot`` makes it a reply to a bot message."""
        cid = channel_id or self.channel_id
        mentions, roles = [], []
        if mention:
            text, mentions = f"<@{self.bot.id}> {text}", [self.bot]
        if role_mention:
            text, roles = f"<@&{self.bot_role_id}> {text}", [self.bot_role_id]
        ref = None
        if reply_to_bot:
            ref = self.message_payload("an earlier bot answer", author=self.bot, channel_id=cid)
        d = self.message_payload(text, author=user, channel_id=cid, mentions=mentions,
                                 mention_roles=roles, reply_to=ref, message_id=message_id)
        await self.dispatch("MESSAGE_CREATE", d)
        return d

    async def create_thread(self, name: str, parent_id: str | None = None,
                            thread_id: str | None = None) -> str:
        """A new thread (THREAD_CREATE, newly_created); returns its id (``thread_id``: a
        thread started from a message has that message's id, as on Discord)."""
        tid = thread_id or self.new_id()
        t = {**self._thread(tid, name, parent_id), "newly_created": True}
        self._threads[tid] = self._thread(tid, name, parent_id)
        await self.dispatch("THREAD_CREATE", t)
        return tid

    async def react(self, message_id: str, emoji: str = "👍", *, user: FakeUser | None = None,
                    channel_id: str | None = None, guild: bool = True) -> dict[str, Any]:
        """MESSAGE_REACTION_ADD by ``user`` on ``message_id``."""
        user = user or self.alice
        d: dict[str, Any] = {"user_id": user.id, "message_id": message_id,
                             "channel_id": channel_id or self.channel_id,
                             "emoji": {"id": None, "name": emoji}, "burst": False,
                             "burst_colors": [], "type": 0}
        if guild:
            d["guild_id"] = self.guild_id
            d["member"] = {**self._member(user), "user": user.payload()}
        else:
            d["channel_id"] = channel_id or self.dm_channel_for(user)
        await self.dispatch("MESSAGE_REACTION_ADD", d)
        return d

    async def edit(self, original: dict[str, Any], new_text: str) -> dict[str, Any]:
        """MESSAGE_UPDATE of ``original`` (a payload returned by send_*) with new content."""
        d = {**original, "content": new_text, "edited_timestamp": now_iso()}
        await self.dispatch("MESSAGE_UPDATE", d)
        return d

    async def delete(self, original: dict[str, Any]) -> None:
        """MESSAGE_DELETE of ``original``."""
        d = {"id": original["id"], "channel_id": original["channel_id"]}
        if "guild_id" in original:
            d["guild_id"] = original["guild_id"]
        await self.dispatch("MESSAGE_DELETE", d)
