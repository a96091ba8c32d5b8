"""Shared pieces of the fake Slack (tests/fakes/fake_slack/): request signing, channel id
conventions, injected failures, Web API answers."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from aiohttp import web

WRITE_METHODS = {"chat.postMessage", "chat.update", "chat.delete", "reactions.add", "pins.add",
                 "reactions.remove", "chat.startStream", "chat.appendStream",
                 "chat.stopStream"}
DEFAULT_USERS = {
    "U0ALICE": {"name": "alice", "real_name": "Alice Liddell", "display_name": "alice"},
    "U0BOB": {"name": "bob", "real_name": "Bob Builder", "display_name": ""},
    "U0OTHERBOT": {"name": "otherbot", "real_name": "Other Bot", "display_name": "", "is_bot": True},
}


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 request signature: ``v0=`` + hex HMAC-SHA256 of ``v0:{ts}:{body}``."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def dm_channel_of(user_id: str) -> str:
    """The fake's IM channel id for a user (``U0ALICE`` -> ``D0ALICE``)."""
    return "D" + user_id[1:]


def channel_type_of(channel: str) -> str:
    """Slack's ``channel_type`` for an id prefix: C channel, G private/group, D im."""
    return {"C": "channel", "G": "group", "D": "im"}.get(channel[:1], "channel")


_DROP: Any = object()  # _injected's verdict: run the call, then drop the connection


@dataclass
class FailRule:
    """One injected failure for the next ``count`` matching calls.

    kind: ``ratelimited`` (429 + Retry-After), ``markup`` (ok:false ``error``, only for
    formatted sends: ``mrkdwn`` not false or ``blocks`` present), ``error`` (ok:false
    ``error``), ``5xx`` (``status`` with a text body), ``drop`` (the call succeeds, then
    the connection is closed before the response).
    """

    method: str = "chat.postMessage"
    kind: str = "ratelimited"
    count: int = 1
    retry_after: int = 1
    error: str = "ratelimited"
    status: int = 500


def _formatted(args: dict[str, Any]) -> bool:
    return bool(args.get("blocks")) or str(args.get("mrkdwn", "true")).lower() != "false"


def _ok(data: dict[str, Any]) -> web.Response:
    body = {"ok": True, **data}
    resp = web.json_response(body)
    resp._fake_body = body  # type: ignore[attr-defined]
    return resp


def _err(error: str) -> web.Response:
    body = {"ok": False, "error": error}
    resp = web.json_response(body)
    resp._fake_body = body  # type: ignore[attr-defined]
    return resp
