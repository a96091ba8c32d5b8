"""Slack's live check (``ChannelPlugin.probe``): ``auth.test`` with the bot token (the
app-level token of Socket Mode is checked when the socket connects)."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.probing import http_json


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """``(True, "bot <user> in <team>")`` or ``(False, why)`` (``invalid_auth``)."""
    base = str(account.api_base_url).rstrip("/")
    body, error = await asyncio.to_thread(
        http_json, f"{base}/auth.test", data=b"", method="POST", timeout=timeout,
        headers={"Authorization": f"Bearer {str(account.bot_token).strip()}"})
    if error:
        return False, error
    assert body is not None
    if not body.get("ok"):
        return False, str(body.get("error"))
    return True, f"bot {body.get('user')} in {body.get('team')}"
