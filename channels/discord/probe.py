"""Discord's live check (``ChannelPlugin.probe``): ``GET /users/@me`` with the bot
token."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.probing import http_json


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """``(True, "bot <username>")`` or ``(False, why)`` (``HTTP 401 (token rejected)``)."""
    base = str(account.api_base_url).rstrip("/")
    body, error = await asyncio.to_thread(
        http_json, f"{base}/users/@me", timeout=timeout,
        headers={"Authorization": f"Bot {str(account.token).strip()}"})
    if error:
        return False, error
    assert body is not None
    if "id" not in body:
        return False, str(body)[:200]
    return True, f"bot {body.get('username')}"
