"""Slack Web API plumbing for the Slack adapter: error classification, the HTTP Events API
signature check, and the ``users.info`` name cache.

Sources: Web API errors and rate limits (https://docs.slack.dev/apis/web-api/rate-limits:
HTTP 429 + ``Retry-After`` seconds, body ``error: ratelimited``), request signing
(https://docs.slack.dev/authentication/verifying-requests-from-slack: ``v0=`` + hex
HMAC-SHA256 of ``v0:{timestamp}:{body}``, timestamps older than 5 minutes rejected),
``users.info`` (https://docs.slack.dev/reference/methods/users.info).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from runtime.clock import Clock, maybe_timeout

log = structlog.get_logger(__name__)

SIGNATURE_MAX_AGE = 300.0  # seconds; Slack's documented replay window
# Token problems: retrying cannot help, the account needs a config fix.
AUTH_ERRORS = frozenset({
    "invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired",
    "not_allowed_token_type", "missing_scope", "no_permission", "team_access_not_granted",
})
# Formatting-related rejections: resend the same part as plain text.
MARKUP_ERRORS = frozenset({"invalid_blocks", "invalid_blocks_format", "invalid_attachments",
                           "msg_too_long", "markdown_text_conflict"})
TRANSIENT_ERRORS = frozenset({"internal_error", "fatal_error", "service_unavailable",
                              "request_timeout", "ratelimited"})
# Connection failures where the request never reached Slack: safe to retry at once.
NETWORK_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError, TimeoutError)


@dataclass(frozen=True, slots=True)
class ApiFailure:
    """What a failed Web API call said: HTTP ``status``, Slack ``error`` code (None when the
    body was not Slack JSON, e.g. a 5xx page) and ``retry_after`` seconds (429 only)."""

    status: int
    error: str | None
    retry_after: float | None

    @property
    def auth(self) -> bool:
        return self.error in AUTH_ERRORS

    @property
    def rate_limited(self) -> bool:
        return self.status == 429 or self.error == "ratelimited"

    @property
    def transient(self) -> bool:
        return self.status >= 500 or self.status == 408 or self.error in TRANSIENT_ERRORS

    def describe(self) -> str:
        """Short, secret-free text for logs and ``last_error``."""
        return f"slack api error {self.error or 'http_' + str(self.status)}"


def api_failure(exc: SlackApiError) -> ApiFailure:
    """Read status, error code and Retry-After off a ``SlackApiError`` without trusting its
    body's shape (a 5xx body may be text, not JSON)."""
    resp = getattr(exc, "response", None)
    status = getattr(resp, "status_code", 0) or 0
    data = getattr(resp, "data", None)
    error = data.get("error") if isinstance(data, dict) else None
    headers = getattr(resp, "headers", None) or {}
    retry_after: float | None = None
    raw = headers.get("Retry-After") or headers.get("retry-after")
    if raw is not None:
        try:
            retry_after = max(0.0, float(raw))
        except (TypeError, ValueError):
            retry_after = None
    if (status == 429 or error == "ratelimited") and retry_after is None:
        retry_after = 1.0
    return ApiFailure(int(status), error if isinstance(error, str) else None, retry_after)


def describe_error(exc: BaseException) -> str:
    """Secret-free one-line description of any error the adapter meets (tokens travel in
    headers, never in URLs, so aiohttp's messages are safe; Slack errors are reduced to the
    error code)."""
    if isinstance(exc, SlackApiError):
        return api_failure(exc).describe()
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def signature_of(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 request signature for ``body`` sent at ``timestamp`` (epoch seconds)."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, timestamp: str | None,
                     signature: str | None, *, now: float) -> str | None:
    """Check an Events API request. Returns None when valid, else the reason (``missing
    headers``, ``bad timestamp``, ``stale timestamp``, ``bad signature``). ``now`` is epoch
    seconds; the comparison is constant-time."""
    if not timestamp or not signature:
        return "missing headers"
    try:
        ts = int(timestamp)
    except ValueError:
        return "bad timestamp"
    if abs(now - ts) > SIGNATURE_MAX_AGE:
        return "stale timestamp"
    if not hmac.compare_digest(signature_of(secret, timestamp, body), signature):
        return "bad signature"
    return None


class UserNames:
    """``users.info`` lookups with a cache: user id -> (display name, username).

    Hits live ``ttl`` seconds (failures 60 s), at most ``max_entries`` users. A
    ``missing_scope`` answer (no ``users:read``) turns lookups off for good. Lookups never
    raise: on any failure the names are None.
    """

    def __init__(self, web: AsyncWebClient, clock: Clock, *, ttl: float = 3600.0,
                 timeout: float = 5.0, max_entries: int = 2000, account_id: str = "") -> None:
        self._web, self._clock = web, clock
        self._ttl, self._timeout, self._max = ttl, timeout, max_entries
        self._cache: dict[str, tuple[str | None, str | None, float]] = {}
        self._enabled = True
        self._account_id = account_id

    async def lookup(self, user_id: str) -> tuple[str | None, str | None]:
        """(display name, username) of ``user_id``; (None, None) when unknown."""
        now = self._clock.monotonic()
        hit = self._cache.get(user_id)
        if hit is not None and hit[2] > now:
            return hit[0], hit[1]
        if not self._enabled:
            return None, None
        name = username = None
        ttl = 60.0
        try:
            async with maybe_timeout(self._clock, self._timeout):
                resp = await self._web.users_info(user=user_id)
            user: dict[str, Any] = resp.get("user") or {}
            profile = user.get("profile") or {}
            name = (profile.get("display_name") or profile.get("real_name")
                    or user.get("real_name") or user.get("name") or None)
            username = user.get("name") or None
            ttl = self._ttl
        except SlackApiError as exc:
            failure = api_failure(exc)
            if failure.error in ("missing_scope", "not_allowed_token_type"):
                self._enabled = False
                log.warning("slack_user_lookup_disabled", account_id=self._account_id,
                            error=failure.error, hint="add the users:read scope for names")
            else:
                log.debug("slack_user_lookup_failed", account_id=self._account_id,
                          user_id=user_id, error=failure.describe())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - names are optional
            log.debug("slack_user_lookup_failed", account_id=self._account_id,
                      user_id=user_id, error=describe_error(exc))
        if len(self._cache) >= self._max:
            self._cache.clear()  # crude but bounded; a refill costs one call per user
        self._cache[user_id] = (name, username, now + ttl)
        return name, username
