"""WhatsApp's live check (``ChannelPlugin.probe``): the Graph API lookup of the business
phone number (``GET /<version>/<phone_number_id>?fields=display_phone_number,
verified_name``) with the access token. The app secret and verify token are checked by
Meta's webhook calls, not here (``tidegate doctor`` probes the webhook)."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.probing import http_json


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """``(True, "number +1 555-… (Name)")`` or ``(False, why)``: ``HTTP 401 (token
    rejected)`` for a revoked token, ``HTTP 400``/``404`` for a wrong phone number id."""
    base = (f"{str(account.api_base_url).rstrip('/')}/{account.api_version}/"
            f"{account.phone_number_id}")
    body, error = await asyncio.to_thread(
        http_json, f"{base}?fields=display_phone_number,verified_name", timeout=timeout,
        headers={"Authorization": f"Bearer {str(account.access_token).strip()}"})
    if error:
        return False, error
    assert body is not None
    if "display_phone_number" not in body:
        return False, str(body)[:200]
    return True, f"number {body['display_phone_number']} ({body.get('verified_name')})"
