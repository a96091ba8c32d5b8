"""Which failed sends may have arrived (channels/outbound/send_outcome.py), with the real exception
types the platform libraries raise."""

from __future__ import annotations

import aiohttp
import httpx
from telegram.error import NetworkError, TimedOut

from channels.outbound.delivery import DeliveryError
from channels.outbound.send_outcome import SendOutcomeUnknown, outcome_unknown


def wrapped(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as final:  # noqa: BLE001
        return final


def test_connect_failures_and_refusals_certainly_did_not_arrive():
    req = httpx.Request("POST", "http://127.0.0.1/bot/sendMessage")
    assert not outcome_unknown(wrapped(NetworkError("x"), httpx.ConnectError("no", request=req)))
    assert not outcome_unknown(wrapped(TimedOut(), httpx.ConnectTimeout("slow", request=req)))
    assert not outcome_unknown(ConnectionRefusedError())
    http_503 = DeliveryError("Discord HTTP 503", retryable=True)
    http_503.status = 503  # type: ignore[attr-defined]
    assert not outcome_unknown(http_503)


def test_written_but_unanswered_sends_are_unknown():
    req = httpx.Request("POST", "http://127.0.0.1/bot/sendMessage")
    dropped = httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                        request=req)
    assert outcome_unknown(wrapped(NetworkError("httpx.RemoteProtocolError"), dropped))
    assert outcome_unknown(wrapped(TimedOut(), httpx.ReadTimeout("slow", request=req)))
    assert outcome_unknown(wrapped(DeliveryError("network", retryable=True),
                                   aiohttp.ServerDisconnectedError()))
    assert outcome_unknown(TimeoutError())
    assert outcome_unknown(SendOutcomeUnknown("lookup failed"))
