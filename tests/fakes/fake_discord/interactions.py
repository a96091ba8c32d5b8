"""Application commands and interactions for the fake Discord (tests/fakes/fake_discord/),
faithful to the parts discord.py's ``app_commands`` uses
(Discord API reference: Interactions, "Application Commands" and "Receiving and
Responding"):

- ``PUT|GET /applications/{app}/commands`` and ``/applications/{app}/guilds/{g}/commands``
  (bulk overwrite: the registered set is replaced, each command gets an id and version;
  403 50001 Missing Access for a guild the bot is not in).
- :meth:`Interactions.invoke` builds an INTERACTION_CREATE (type 2, APPLICATION_COMMAND)
  for a *registered* command — Discord only sends those — with ``member`` in guilds and
  ``user`` in DMs, and dispatches it over the gateway.
- ``POST /interactions/{id}/{token}/callback[?with_response=true]``: types 4 (message) and
  5 (deferred, "thinking"); ``flags`` 64 = ephemeral. Only one initial response, only within
  :attr:`response_deadline` seconds of the dispatch (else 404 10062 Unknown interaction),
  400 40060 when already acknowledged.
- ``PATCH|DELETE /webhooks/{app}/{token}/messages/@original`` and ``POST
  /webhooks/{app}/{token}`` (follow-ups), valid for :attr:`token_ttl` seconds (else 401
  50027 Invalid Webhook Token). These routes carry no bot token, as on Discord.

Ephemeral responses are kept in :attr:`Interaction.responses`, never in the channel's
messages (only the invoking user sees them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.fake_discord.wire import error, json_response

EPHEMERAL = 64
LOADING = 128


@dataclass
class Interaction:
    """One dispatched interaction and everything the bot answered to it."""

    id: str
    token: str
    name: str
    channel_id: str
    guild: bool
    created: float
    callback: dict[str, Any] | None = None  # the initial response body
    callback_at: float | None = None  # seconds after the dispatch
    original: dict[str, Any] | None = None  # the response message (after edits)
    followups: list[dict[str, Any]] = field(default_factory=list)
    deleted: bool = False
    kind: int = 2  # 2 APPLICATION_COMMAND, 3 MESSAGE_COMPONENT (components.py)

    @property
    def ephemeral(self) -> bool:
        flags = int(((self.callback or {}).get("data") or {}).get("flags") or 0)
        return bool(flags & EPHEMERAL)

    @property
    def responses(self) -> list[str]:
        """What the invoking user sees: the original response's text, then follow-ups."""
        first = [] if self.original is None or self.deleted else [self.original["content"]]
        return first + [f["content"] for f in self.followups]


class Interactions:
    """Command registry and interaction state of one fake; ``fake`` is the FakeDiscord."""

    def __init__(self, fake: Any) -> None:
        self.fake = fake
        self.commands: dict[str | None, list[dict[str, Any]]] = {}  # guild id|None -> set
        self.registrations: list[dict[str, Any]] = []  # every PUT: {"guild_id", "names"}
        self.by_id: dict[str, Interaction] = {}
        self.by_token: dict[str, Interaction] = {}
        self.response_deadline = 3.0
        self.token_ttl = 15 * 60.0

    @staticmethod
    def is_token_route(path: str) -> bool:
        """Routes authenticated by the interaction token, not ``Authorization: Bot``."""
        return path.startswith(("/interactions/", "/webhooks/"))

    # ------------------------------------------------------------------ registry

    def registered(self, guild_id: str | None = None) -> list[str]:
        return [c["name"] for c in self.commands.get(guild_id, [])]

    def _overwrite(self, guild_id: str | None, body: Any) -> web.Response:
        if not isinstance(body, list):
            return error(400, 50035, "Invalid Form Body")
        out = []
        for cmd in body:
            if not 1 <= len(str(cmd.get("name", ""))) <= 32 or \
                    not 1 <= len(str(cmd.get("description", ""))) <= 100:
                return error(400, 50035, "Invalid Form Body")
            out.append({**cmd, "id": self.fake.new_id(), "application_id": self.fake.bot.id,
                        "version": self.fake.new_id(), "type": cmd.get("type", 1),
                        **({"guild_id": guild_id} if guild_id else {})})
        self.commands[guild_id] = out
        self.registrations.append({"guild_id": guild_id, "names": [c["name"] for c in out]})
        return json_response(out)

    # ------------------------------------------------------------------ invoking

    def _find(self, name: str, guild: bool) -> dict[str, Any]:
        scopes = ([self.fake.guild_id] if guild else []) + [None]
        for scope in scopes:
            for cmd in self.commands.get(scope, []):
                if cmd["name"] == name:
                    return cmd
        raise ValueError(f"command /{name} is not registered (Discord would not offer it)")

    async def invoke(self, name: str, value: str | None = None, *, user: Any = None,
                     channel_id: str | None = None, guild: bool = True) -> Interaction:
        """A user runs ``/name [value]`` in ``channel_id`` (default #general) or, with
        ``guild=False``, in their DM with the bot. Returns the interaction record."""
        fake = self.fake
        user = user or fake.alice
        cmd = self._find(name, guild)
        cid = channel_id or (fake.channel_id if guild else fake.dm_channel_for(user))
        channel = fake._channel(cid)
        if channel is None:
            raise ValueError(f"unknown channel {cid}")
        data: dict[str, Any] = {"id": cmd["id"], "name": name, "type": 1}
        if cmd.get("guild_id"):
            data["guild_id"] = cmd["guild_id"]
        if value is not None:
            data["options"] = [{"name": "value", "type": 3, "value": value}]
        record = Interaction(id=fake.new_id(), token=f"itok-{fake.new_id()}", name=name,
                             channel_id=cid, guild=guild, created=time.monotonic())
        payload: dict[str, Any] = {
            "id": record.id, "application_id": fake.bot.id, "type": 2, "data": data,
            "channel_id": cid, "channel": channel, "token": record.token, "version": 1,
            "locale": "en-US", "app_permissions": "274877975552", "entitlements": [],
            "attachment_size_limit": 10 * 1024 * 1024,
            "authorizing_integration_owners": {"0": fake.guild_id} if guild else {"1": user.id},
            "context": 0 if guild else 1}
        if guild:
            payload.update(guild_id=fake.guild_id, guild_locale="en-US",
                           guild={"id": fake.guild_id, "locale": "en-US", "features": []},
                           member={**fake._member(user), "user": user.payload(),
                                   "permissions": "1071698660929"})
        else:
            payload["user"] = user.payload()
        self.by_id[record.id] = record
        self.by_token[record.token] = record
        await fake.dispatch("INTERACTION_CREATE", payload)
        return record

    # ------------------------------------------------------------------ responses

    def _message(self, record: Interaction, content: str, flags: int) -> dict[str, Any]:
        msg = self.fake.message_payload(content, author=self.fake.bot,
                                        channel_id=record.channel_id, guild=record.guild)
        msg.pop("member", None)
        msg.update(flags=flags, webhook_id=self.fake.bot.id, type=20,
                   application_id=self.fake.bot.id,
                   interaction_metadata={"id": record.id, "type": 2,
                                         "user": self.fake.alice.payload()})
        return msg

    def _callback(self, iid: str, token: str, body: dict[str, Any],
                  with_response: bool) -> web.Response:
        record = self.by_id.get(iid)
        if record is None or record.token != token:
            return error(404, 10062, "Unknown interaction")
        if record.callback is not None:
            return error(400, 40060, "Interaction has already been acknowledged.")
        elapsed = time.monotonic() - record.created
        if elapsed > self.response_deadline:
            return error(404, 10062, "Unknown interaction")
        rtype = int(body.get("type") or 0)
        if rtype not in ((4, 5, 6, 7) if record.kind == 3 else (4, 5)):
            return error(400, 50035, "Invalid Form Body")
        data = body.get("data") or {}
        flags = int(data.get("flags") or 0) | (LOADING if rtype == 5 else 0)
        record.callback, record.callback_at = body, elapsed
        record.original = self._message(record, data.get("content") or "", flags)
        if not with_response:
            return web.Response(status=204)
        return json_response({"interaction": {
            "id": iid, "type": 2, "response_message_id": record.original["id"],
            "response_message_loading": rtype == 5,
            "response_message_ephemeral": bool(flags & EPHEMERAL)},
            "resource": {"type": rtype, "message": record.original}})

    def _webhook(self, method: str, token: str, rest: list[str],
                 body: dict[str, Any]) -> web.Response:
        record = self.by_token.get(token)
        if record is None or time.monotonic() - record.created > self.token_ttl:
            return error(401, 50027, "Invalid Webhook Token")
        if rest == ["messages", "@original"]:
            if record.original is None or record.deleted:
                return error(404, 10008, "Unknown Message")
            if method == "DELETE":
                record.deleted = True
                return web.Response(status=204)
            if method == "PATCH":
                content = body.get("content")
                if content is not None and len(content) > 2000:
                    return error(400, 50035, "Invalid Form Body")
                if content is not None:
                    record.original["content"] = content
                record.original["flags"] = int(record.original["flags"]) & ~LOADING
                return json_response(record.original)
        if rest == [] and method == "POST":
            content = str(body.get("content") or "")
            if not content or len(content) > 2000:
                return error(400, 50035, "Invalid Form Body")
            msg = self._message(record, content, int(body.get("flags") or 0))
            record.followups.append(msg)
            return json_response(msg)
        return error(405, 0, "405: Method Not Allowed")

    async def route(self, method: str, parts: list[str], body: Any,
                    query: Any) -> web.Response | None:
        """Answer a REST call of this module's routes; None for any other route."""
        if len(parts) >= 3 and parts[0] == "applications" and parts[-1] == "commands":
            guild = parts[3] if len(parts) == 5 and parts[2] == "guilds" else None
            if len(parts) not in (3, 5):
                return None
            if guild is not None and guild != self.fake.guild_id:
                return error(403, 50001, "Missing Access")  # the bot is not in that guild
            if method == "PUT":
                return self._overwrite(guild, body)
            if method == "GET":
                return json_response(self.commands.get(guild, []))
            return None
        if len(parts) == 4 and parts[0] == "interactions" and parts[3] == "callback" \
                and method == "POST":
            wants = str(query.get("with_response", "")).lower() in ("1", "true")
            return self._callback(parts[1], parts[2], body or {}, wants)
        if len(parts) >= 3 and parts[0] == "webhooks" and parts[1] == self.fake.bot.id:
            return self._webhook(method, parts[2], parts[3:], body or {})
        return None

