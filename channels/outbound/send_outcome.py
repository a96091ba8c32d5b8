"""Did a failed send arrive? Failures fall into two kinds (README "Delivery guarantees"):

- **certainly not delivered**: the connection was never made (connect errors, connect or
  pool timeouts, DNS) or the platform answered that it refused the message (HTTP 429,
  5xx, or an API error). Resending cannot double it;
- **outcome unknown**: the request was written and no answer came (the server dropped the
  connection, a read timeout, our own send timeout). The platform may have accepted it,
  so a blind resend could deliver it twice. Each adapter resolves these its own way:
  Discord resends with the same ``nonce`` (``enforce_nonce``: idempotent), Slack looks
  the message up first, Telegram cannot check and records the send as ``unconfirmed``.

Classification walks the exception and its ``__cause__``/``__context__`` chain, since
python-telegram-bot wraps httpx errors (``NetworkError``/``TimedOut`` raised ``from`` the
httpx exception) and our own wrappers chain the original.
"""

from __future__ import annotations

import asyncio

# httpx (python-telegram-bot) and aiohttp (discord.py, slack-sdk) class names
_NOT_SENT = {"ConnectError", "ConnectTimeout", "PoolTimeout", "ClientConnectorError",
             "ClientConnectorDNSError", "ClientConnectorCertificateError",
             "ClientProxyConnectionError", "ConnectionRefusedError", "gaierror",
             "UnsupportedProtocol", "InvalidURL"}
_UNKNOWN = {"ReadError", "ReadTimeout", "RemoteProtocolError", "WriteError", "WriteTimeout",
            "ServerDisconnectedError", "ClientPayloadError", "ServerTimeoutError",
            "SocketTimeoutError", "ClientOSError", "ConnectionResetError",
            "IncompleteReadError", "LocalProtocolError"}


class SendOutcomeUnknown(Exception):
    """A send was written and no answer came; raised by adapters that could not resolve
    it (see module docstring). ``send_chunks`` reports such a part as unconfirmed."""


def _chain(exc: BaseException, depth: int = 6) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(out) < depth and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def outcome_unknown(exc: BaseException) -> bool:
    """True when ``exc`` means the request may have reached the platform unanswered.

    A connect-phase error anywhere in the chain means it certainly did not; an HTTP
    status on the exception (a response came) means the platform answered. A bare
    ``TimeoutError`` (our own send timeout around a request in flight) is unknown."""
    chain = _chain(exc)
    names = {c.__name__ for e in chain for c in type(e).__mro__}
    if names & _NOT_SENT:
        return False
    for e in chain:
        if isinstance(e, SendOutcomeUnknown):
            return True
        for obj in (e, getattr(e, "response", None)):
            status = getattr(obj, "status", None) or getattr(obj, "status_code", None)
            if isinstance(status, int) and 100 <= status < 600:
                return False
    if names & _UNKNOWN:
        return True
    return any(type(e) in (TimeoutError, asyncio.TimeoutError) for e in chain)
