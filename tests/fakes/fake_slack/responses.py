"""Slash-command ``response_url``s for the fake Slack (tests/fakes/fake_slack/), as
Slack documents them (https://docs.slack.dev/interactivity/handling-user-interaction#message_responses):
each slash command carries a ``response_url`` that takes up to 5 JSON POSTs within 30
minutes; ``response_type`` ``ephemeral`` (the default) is shown only to the invoking user,
``in_channel`` to everyone. A bad body answers 400 ``invalid_payload``, a used-up or
expired URL 404 ``expired_url``, an unknown one 404 ``no_service``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

USES = 5
TTL = 30 * 60.0


@dataclass
class ResponseUrl:
    """One command's response URL and what was posted to it (``posts``: JSON bodies)."""

    id: str
    user: str
    channel: str
    command: str
    created: float
    posts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ephemeral_texts(self) -> list[str]:
        return [p.get("text", "") for p in self.posts
                if p.get("response_type", "ephemeral") == "ephemeral"]


class ResponseUrls:
    """The response URLs handed out by one fake (``base``: the fake's URL)."""

    def __init__(self) -> None:
        self.by_id: dict[str, ResponseUrl] = {}
        self.ttl = TTL

    def new(self, base: str, *, user: str, channel: str, command: str) -> str:
        rid = uuid.uuid4().hex
        self.by_id[rid] = ResponseUrl(rid, user, channel, command, time.monotonic())
        return f"{base}/_response/{rid}"

    def of(self, url: str) -> ResponseUrl:
        """The record behind a ``response_url`` value."""
        return self.by_id[url.rsplit("/", 1)[-1]]

    async def handle(self, request: web.Request) -> web.Response:
        record = self.by_id.get(request.match_info["rid"])
        if record is None:
            return web.Response(status=404, text="no_service")
        if len(record.posts) >= USES or time.monotonic() - record.created > self.ttl:
            return web.Response(status=404, text="expired_url")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        if not isinstance(body, dict) or not (body.get("text") or body.get("blocks")) or \
                body.get("response_type", "ephemeral") not in ("ephemeral", "in_channel"):
            return web.Response(status=400, text="invalid_payload")
        record.posts.append(body)
        return web.Response(text="ok")
