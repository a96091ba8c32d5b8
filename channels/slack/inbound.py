"""Inbound Slack plumbing: the bolt ``AsyncApp`` that receives events and slash commands
(Socket Mode and HTTP alike), and the HTTP Events API endpoint.

Sources: bolt-python async apps (https://docs.slack.dev/tools/bolt-python), the Events API
over HTTP (https://docs.slack.dev/apis/events-api: ``url_verification`` challenge, answer
within 3 s, retries with ``X-Slack-Retry-Num``/``X-Slack-Retry-Reason``) and request signing
(channels/slack/api.py ``verify_signature``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import describe_error, verify_signature
from channels.slack.events import BotIdentity
from runtime.clock import Clock

log = structlog.get_logger(__name__)

# (kind "event"|"command", bolt body) -> awaitable that completes once the gateway has
# accepted (journaled) the payload; bolt acknowledges Slack only after that. It raises
# AckWithheld when the gateway did not accept it in time: then no ack is sent at all.
Enqueue = Callable[[str, dict[str, Any]], Awaitable[None]]


class AckWithheld(Exception):
    """The gateway has not accepted (journaled) a payload in time. Raised by ``Enqueue``
    inside the bolt listener: bolt's result is then 503, so Socket Mode sends no ack
    (slack_bolt sends an envelope response only for a 200 result) and HTTP mode answers
    503; either way Slack delivers the event again (channels/slack/adapter.py
    ``SlackChannel._enqueue``)."""


def build_app(*, base_url: str, session: aiohttp.ClientSession, bot_token: str,
              get_bot: Callable[[], BotIdentity | None], enqueue: Enqueue,
              account_id: str,
              on_action: Callable[[dict[str, Any]], None] | None = None) -> AsyncApp:
    """A bolt app that hands every event and slash command to ``enqueue`` (called in
    arrival order) and acks it once ``enqueue``'s awaitable completes, i.e. once the
    gateway has durably accepted it (``process_before_response``): a crash before that
    leaves the event unacknowledged, so Slack delivers it again. When ``enqueue`` raises
    :class:`AckWithheld` the listener fails on purpose: no ack goes out (status 503).

    Authorization comes from the adapter's own ``auth.test`` (``get_bot``) rather than
    bolt's lazy one on the first event, whose failure would drop that event. Bolt's
    built-in middleware still drops the bot's own events. Bolt errors (an event it cannot
    parse) are logged as ``slack_event_rejected``. Request signatures are checked by
    :func:`handle_events_request`, not by bolt. A Block Kit button press (``block_actions``)
    is acked at once and handed to ``on_action(body)`` (which must not block).
    """
    # Bolt injects listener arguments by parameter name and trips over a bound method's
    # ``self``, hence closures. The client carries no token so bolt uses ``authorize``.
    client = AsyncWebClient(base_url=base_url, session=session, retry_handlers=[])

    async def authorize(enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
        bot = get_bot()
        if bot is None:
            raise RuntimeError("slack adapter not authenticated yet")
        return AuthorizeResult(enterprise_id=enterprise_id, team_id=team_id or bot.team_id,
                               bot_user_id=bot.user_id, bot_id=bot.bot_id, bot_token=bot_token)

    async def on_event(body: dict[str, Any]) -> None:
        await enqueue("event", body)  # bolt acks when the listener returns

    async def on_command(ack: Any, body: dict[str, Any]) -> None:
        await enqueue("command", body)
        await ack()

    async def on_block_action(ack: Any, body: dict[str, Any]) -> None:
        await ack()
        if on_action is not None:
            on_action(body)

    async def on_error(error: Exception, body: Any) -> BoltResponse | None:
        if isinstance(error, AckWithheld):  # logged by the adapter as slack_ack_withheld
            return BoltResponse(status=503, body="")
        body = body if isinstance(body, dict) else {}
        event = body.get("event") if isinstance(body.get("event"), dict) else {}
        log.warning("slack_event_rejected", account_id=account_id,
                    event_id=body.get("event_id"), event_type=event.get("type"),
                    error=describe_error(error))
        return None

    app = AsyncApp(client=client, authorize=authorize, request_verification_enabled=False,
                   process_before_response=True)
    app.event(re.compile(".*"))(on_event)
    app.command(re.compile(".*"))(on_command)
    app.action(re.compile(".*"))(on_block_action)
    app.error(on_error)
    return app


async def handle_events_request(request: web.Request, *, app: AsyncApp | None,
                                signing_secret: str, clock: Clock,
                                account_id: str) -> web.Response:
    """One Events API / slash-command POST from Slack.

    401 for a missing, malformed, stale (> 5 min by ``clock``) or wrong signature; 400 for
    a JSON body that does not parse; the ``url_verification`` challenge echoed; 503 while
    ``app`` is None (not authenticated yet — Slack retries); otherwise bolt's answer: 200
    once the gateway accepted the payload, 503 when it was not accepted in time
    (:class:`AckWithheld`; Slack retries).
    """
    body = await request.read()
    problem = verify_signature(signing_secret, body,
                               request.headers.get("X-Slack-Request-Timestamp"),
                               request.headers.get("X-Slack-Signature"), now=clock.time())
    if problem is not None:
        log.warning("slack_signature_rejected", account_id=account_id, reason=problem)
        return web.json_response({"ok": False, "error": "invalid_signature"}, status=401)
    if request.content_type == "application/json":
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):  # nesting deeper than the parser goes
            log.warning("slack_event_malformed", account_id=account_id,
                        error="body is not JSON")
            return web.json_response({"ok": False, "error": "bad_json"}, status=400)
        if isinstance(payload, dict) and payload.get("type") == "url_verification":
            return web.json_response({"challenge": payload.get("challenge")})
    if app is None:
        return web.json_response({"ok": False, "error": "not_ready"}, status=503)
    retry = request.headers.get("X-Slack-Retry-Num")
    if retry:
        log.debug("slack_event_retry", account_id=account_id, retry_num=retry,
                  reason=request.headers.get("X-Slack-Retry-Reason"))
    bolt_req = AsyncBoltRequest(body=body.decode("utf-8", "replace"),
                                query=request.query_string, headers=dict(request.headers))
    resp = await app.async_dispatch(bolt_req)
    ctype = (resp.headers.get("content-type") or ["text/plain"])[0].split(";")[0]
    return web.Response(status=resp.status, body=resp.body or "", content_type=ctype)
