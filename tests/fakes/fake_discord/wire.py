"""Shared wire pieces of the fake Discord (tests/fakes/fake_discord/): JSON responses with
the bare ``Content-Type: application/json`` discord.py insists on, Discord's error body,
snowflake epoch, limits, and the small records the parts share."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

DISCORD_EPOCH_MS = 1_420_070_400_000
MESSAGE_CONTENT_INTENT = 1 << 15
TEXT_LIMIT = 2000
ATTACHMENT_LIMIT = 10 * 1024 * 1024  # per request, for bots in servers without boosts
SESSION_BUFFER = 1000  # dispatches a session keeps for a RESUME
PAYLOAD = web.RequestKey("payload", object)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # discord.py only parses JSON when the content type is exactly application/json.
    return web.Response(body=json.dumps(data).encode(), status=status, headers=headers,
                        content_type="application/json")


def error(status: int, code: int, message: str, errors: dict | None = None) -> web.Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if errors:
        body["errors"] = errors
    return json_response(body, status)


@dataclass
class Failure:
    kind: str  # "429" | "markup" | "status"
    remaining: int
    retry_after: float = 1.0
    status: int = 503
    is_global: bool = False


@dataclass(eq=False)
class Session:
    """A gateway session: it outlives its connection (resumable) until the client closes
    with 1000/1001 or its buffer no longer reaches back far enough."""

    id: str
    intents: int
    seq: int = 0
    buffer: deque = field(default_factory=lambda: deque(maxlen=SESSION_BUFFER))
    conn: Conn | None = None


@dataclass(eq=False)
class Conn:
    ws: web.WebSocketResponse
    path: str = "/gateway"
    session: Session | None = None
    ready: bool = False
    kicked: bool = False  # closed by the fake (the session stays resumable)

    @property
    def session_id(self) -> str | None:
        return self.session.id if self.session else None

    @property
    def intents(self) -> int:
        return self.session.intents if self.session else 0


@dataclass
class FakeUser:
    id: str
    username: str
    global_name: str | None = None
    bot: bool = False

    def payload(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "username": self.username, "discriminator": "0",
                             "global_name": self.global_name, "avatar": None,
                             "public_flags": 0}
        if self.bot:
            d["bot"] = True
        return d
