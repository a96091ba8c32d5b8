"""Telegram's live check (``ChannelPlugin.probe``): ``getMe`` with the bot token."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.probing import http_json


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """``(True, "bot @name")`` or ``(False, why)`` (``HTTP 401 (token rejected)``)."""
    base = str(account.api_base_url).rstrip("/")
    body, error = await asyncio.to_thread(
        http_json, f"{base}{str(account.token).strip()}/getMe", timeout=timeout)
    if error:
        return False, error
    assert body is not None
    if not body.get("ok"):
        return False, str(body.get("description"))
    return True, f"bot @{(body.get('result') or {}).get('username')}"
