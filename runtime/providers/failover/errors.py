"""Error classes: every provider failure is classified once, here, for both SDK providers
(seed 001 §2.5; issue 10 "Error classes").

=================  ====================================================================
class              examples
=================  ====================================================================
billing            HTTP 402, ``insufficient_quota``, "credit balance is too low"
auth               401, 403, invalid key, an ``api_key_command`` that fails
rate_limit         429, 529, ``overloaded_error``, an "overloaded" stream error
context_overflow   400 with "maximum context length", "prompt is too long",
                   ``context_length_exceeded``
timeout            read timeout, 408, the call's own deadline
transient          connection reset, cut stream, 5xx, 409, an unrecognised stream error
invalid_request    other 4xx (bad tool schema, unknown model, ...)
=================  ====================================================================

What the turn does with each class lives in ``runtime/providers/failover/chain.py``; what
the user is told in :func:`user_notice`.
"""

from __future__ import annotations

from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Literal

from runtime.clock import parse_iso

ErrorClass = Literal["billing", "auth", "rate_limit", "context_overflow", "timeout",
                     "transient", "invalid_request"]
ERROR_CLASSES: tuple[str, ...] = ("billing", "auth", "rate_limit", "context_overflow",
                                  "timeout", "transient", "invalid_request")
RETRYABLE = frozenset({"rate_limit", "timeout", "transient"})

_BILLING_MARKERS = ("insufficient_quota", "credit balance", "billing", "quota exceeded",
                    "exceeded your current quota", "payment required", "insufficient credit")
_OVERFLOW_MARKERS = ("context_length_exceeded", "context length", "context window",
                     "prompt is too long", "maximum context", "too many tokens")
_AUTH_TYPES = {"authentication_error", "permission_error", "invalid_api_key"}
_RATE_TYPES = {"rate_limit_error", "rate_limit_exceeded", "overloaded_error"}
_TRANSIENT_TYPES = {"api_error", "server_error", "service_unavailable"}


def classify(status: int | None, err_type: str = "", code: str = "",
             message: str = "") -> ErrorClass:
    """The error class of an HTTP error (``status``) or an in-stream error (``status``
    None), from the status, the provider's error ``type``/``code`` and its message.

    Billing is checked first: OpenAI reports an exhausted quota as 429
    ``insufficient_quota`` and Anthropic an empty balance as a 400."""
    haystack = f"{err_type} {code} {message}".lower()
    s = status or 0
    if s == 402 or any(m in haystack for m in _BILLING_MARKERS):
        return "billing"
    if s in (401, 403) or err_type in _AUTH_TYPES or code == "invalid_api_key":
        return "auth"
    if s in (429, 529) or err_type in _RATE_TYPES or (status is None and
                                                       "overloaded" in haystack):
        return "rate_limit"  # a plain 5xx saying "overloaded" is server trouble: transient
    if s in (400, 413) and any(m in haystack for m in _OVERFLOW_MARKERS):
        return "context_overflow"
    if s == 408 or err_type == "timeout_error":
        return "timeout"
    if s >= 500 or s == 409 or err_type in _TRANSIENT_TYPES or status is None:
        return "transient"
    return "invalid_request"


def retry_after_seconds(headers: Mapping[str, str] | None, now: float) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date).

    ``now`` is epoch seconds (for the HTTP-date form). Returns None when absent or unparsable.
    """
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def rate_limit_wait(headers: Mapping[str, str] | None, now: float) -> float | None:
    """Seconds until a rate limit resets, from ``retry-after-ms``, ``Retry-After`` (seconds
    or HTTP date) or Anthropic's ``anthropic-ratelimit-{requests,tokens,input-tokens,
    output-tokens}-reset`` (RFC 3339; the latest of the exhausted ones). ``now`` is epoch
    seconds. None when no header says."""
    if not headers:
        return None
    wait = retry_after_seconds(headers, now)
    if wait is not None:
        return wait
    resets: list[float] = []
    for kind in ("requests", "tokens", "input-tokens", "output-tokens"):
        remaining = headers.get(f"anthropic-ratelimit-{kind}-remaining")
        reset = headers.get(f"anthropic-ratelimit-{kind}-reset")
        if not reset or (remaining is not None and remaining.strip() not in ("0", "")):
            continue
        try:
            resets.append(max(0.0, parse_iso(reset) - now))
        except ValueError:
            continue
    return max(resets) if resets else None


_NOTICES = {
    "billing": "The model provider's quota is used up; the operator has been told.",
    "auth": "The model provider rejected the gateway's credentials; the operator has been "
            "told.",
    "timeout": "The model provider did not answer in time. Please try again shortly.",
    "transient": "The model provider is having trouble right now. Please try again shortly.",
    "context_overflow": "This conversation no longer fits the model's context window. "
                        "Send /new to start a fresh session.",
    "invalid_request": "The model provider refused the request; the operator has been told.",
    "context_guard": "This agent's model has too small a context window to run; the operator "
                     "has been told.",
    "attempts": "The model provider kept failing, so I gave up for now. Please try again "
                "later.",
}


def user_notice(error_class: str, wait_s: float | None = None) -> str:
    """The one short, plain notice a chat user gets for a failed turn of ``error_class``
    (never the provider's own text, which can carry key fragments or internals)."""
    if error_class == "rate_limit":
        if wait_s and wait_s >= 90:
            return (f"The model provider is rate-limiting me; please try again in about "
                    f"{round(wait_s / 60)} minutes.")
        if wait_s and wait_s > 1:
            return (f"The model provider is rate-limiting me; please try again in about "
                    f"{round(wait_s)} seconds.")
        return "The model provider is rate-limiting me; please try again in a minute."
    return _NOTICES.get(error_class, _NOTICES["transient"])


def class_of(kind: str, transient: bool) -> ErrorClass:
    """The error class of a ProviderError's ``kind`` (kinds that are not classes yet —
    ``connection``, ``bad_response`` — are transport trouble: ``transient``)."""
    if kind in ERROR_CLASSES:
        return kind  # type: ignore[return-value]
    return "transient" if transient or kind in ("connection", "bad_response", "server") \
        else "invalid_request"
