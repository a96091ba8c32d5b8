"""The WhatsApp webhook routes on the gateway's HTTP server (``webhook_path``).

- ``GET``: Meta's verification handshake. It calls the callback URL with
  ``hub.mode=subscribe``, ``hub.verify_token=<what you typed in the app>`` and
  ``hub.challenge=<random>``; the answer must be the challenge, as plain text.
- ``POST``: notifications. Each carries ``X-Hub-Signature-256: sha256=<hex>``, the
  HMAC-SHA256 of the raw body keyed with the app secret; anything else is refused with
  401 and logged, before the body is even parsed. The answer is 200 only once every
  message in it is journaled (the gateway's ``on_message`` returned), so a crash before
  that makes Meta redeliver; redeliveries are answered once (the ``wamid`` dedupe).

Reference: https://developers.facebook.com/docs/graph-api/webhooks/getting-started
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from aiohttp import web

SIGNATURE_HEADER = "X-Hub-Signature-256"
# outcomes after which the message is not safely kept: Meta must send it again
_NOT_KEPT = frozenset({"rejected", "failed"})


def signature(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value Meta sends for ``body``: ``sha256=<hex>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_ok(secret: str, body: bytes, header: str | None) -> bool:
    """Constant-time check of ``header`` against :func:`signature`."""
    if not secret or not header:
        return False
    return hmac.compare_digest(header.strip().encode(), signature(secret, body).encode())


async def handle_verify(channel: Any, request: web.Request) -> web.Response:
    """Meta's webhook verification: 200 with ``hub.challenge`` as text when ``hub.mode``
    is ``subscribe`` and ``hub.verify_token`` equals the account's ``verify_token``
    (constant-time compare), else 403 (logged)."""
    q = request.query
    expected = (channel.config.verify_token or "").encode()
    given = q.get("hub.verify_token", "").encode()
    if q.get("hub.mode") != "subscribe" or not expected \
            or not hmac.compare_digest(given, expected):
        channel._log.warning("whatsapp_webhook_verify_refused", remote=request.remote,
                             mode=q.get("hub.mode"),
                             reason="hub.mode is not subscribe" if q.get("hub.mode")
                             != "subscribe" else "hub.verify_token does not match")
        return web.Response(status=403, text="forbidden")
    channel._log.info("whatsapp_webhook_verified", remote=request.remote)
    return web.Response(status=200, text=q.get("hub.challenge", ""),
                        content_type="text/plain")


async def handle_post(channel: Any, request: web.Request) -> web.Response:
    """WhatsApp notifications (messages, reactions, statuses): 401 unless
    ``X-Hub-Signature-256`` is the HMAC-SHA256 of the raw body with the app secret
    (logged, nothing runs), 503 before the adapter is started or while its token is
    rejected (Meta delivers again later), 400 for a body that is
    not a JSON notification, 500 when a message could not be kept (Meta redelivers),
    else 200."""
    body = await request.read()
    header = request.headers.get(SIGNATURE_HEADER)
    if not signature_ok(channel.config.app_secret or "", body, header):
        channel._log.warning("whatsapp_webhook_bad_signature", remote=request.remote,
                             reason="missing" if not header else "mismatch",
                             bytes=len(body))
        return web.Response(status=401, text="bad signature")
    if not channel.ready_for_webhook():
        return web.Response(status=503, text="not ready")
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):  # nesting deeper than the parser goes
        channel._log.warning("whatsapp_webhook_malformed", reason="body is not JSON")
        return web.Response(status=400, text="invalid json")
    try:
        outcomes = await channel.dispatch(payload)
    except ValueError as exc:
        channel._log.warning("whatsapp_webhook_malformed", reason=str(exc))
        return web.Response(status=400, text="not a whatsapp notification")
    if _NOT_KEPT & set(outcomes):
        return web.Response(status=500, text="not kept; send it again")
    return web.Response(status=200, text="ok")
