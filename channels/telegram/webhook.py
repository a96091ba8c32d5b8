"""Telegram webhook mode: the ``POST <webhook_path>`` route of the gateway's aiohttp app
(Bot API ``setWebhook``: https://core.telegram.org/bots/api#setwebhook)."""

from __future__ import annotations

import hmac
from typing import Any

from aiohttp import web

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


async def handle_webhook(channel: Any, request: web.Request) -> web.Response:
    """Telegram's updates in webhook mode: 403 unless ``X-Telegram-Bot-Api-Secret-Token`` equals the account's
    ``webhook_secret`` (constant-time compare), 503 before ``channel`` is connected
    (Telegram retries), 400 for a body that is not JSON, else 200 after
    ``channel.dispatch``."""
    expected = (channel.config.webhook_secret or "").encode()
    given = request.headers.get(SECRET_HEADER, "").encode()
    if not expected or not hmac.compare_digest(given, expected):
        channel._log.warning("telegram_webhook_forbidden", remote=request.remote)
        return web.Response(status=403, text="forbidden")
    if not channel.connected_for_webhook():
        return web.Response(status=503, text="not ready")
    try:
        raw = await request.json()
    except ValueError:
        channel._log.warning("telegram_update_malformed", reason="webhook body is not JSON")
        return web.Response(status=400, text="invalid json")
    await channel.dispatch(raw)
    return web.Response(status=200)
