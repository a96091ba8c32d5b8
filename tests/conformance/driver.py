"""The per-channel driver of the shared conformance test (tests/conformance/test_conformance.py).

Every chat channel — the built-ins and each new one — passes the same conversation
checks: a DM, group mention gating, a long reply split under the platform's limit,
streaming (or its documented absence), media in and out, a restart without loss or
double, an outage and reconnect. What differs between platforms is only how a message is
put into the fake platform and how what the bot posted is read back: that is a
:class:`ChannelDriver`.

A new channel plugs in by adding ONE module ``tests/conformance/drivers/<name>.py`` that
defines ``DRIVER = <YourDriver>()``; :func:`drivers` finds it (no list to edit). Drivers
drive a fake server that follows the platform's documented API (tests/fakes/), or a real
server where one runs offline; the real client library talks to it.

Conventions: ``start``/``stop`` run once per test module (share the server); every
``send_*``/``group`` returns a handle that :meth:`ChannelDriver.redeliver` can deliver
again byte for byte; the readers return what the chat shows *now* (after edits), oldest
first, as text with the platform's markup removed (``plain``).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any


class ChannelDriver:
    """One platform for the conformance suite. Override every method that raises.

    Attributes: ``name`` (the channel plugin's name, ``channels.<name>``); ``limit``
    (one message's limit in the platform's own unit, measured by :meth:`length`);
    ``dm_key`` / ``group_key`` (the session keys a DM from the test user and a message
    in the test group get); ``streams`` (True when replies are streamed by editing
    posted messages; False: the channel documents that it has no streaming and the test
    checks the reply still arrives whole, once); ``restart_keeps`` (how a message sent
    while the gateway is down survives: ``queue`` the platform keeps it until the next
    connection — the test sends one while down and expects it answered once).
    ``groups`` (False: the platform has no group chats, e.g. email, where every message
    is direct; the group test checks the channel's doc page says so) and ``splits``
    (False: one message has no practical limit, e.g. a mail; the long-reply test checks
    the reply arrives whole, in one message, without loss).
    """

    name: str = ""
    limit: int = 4000
    dm_key: str = ""
    group_key: str = ""
    streams: bool = False
    restart_keeps: str = "queue"
    groups: bool = True
    splits: bool = True
    doc_page: str = ""  # docs/channels/<page>.md: where the absence of streaming is said

    # -- the fake platform (once per module) ----------------------------------------------
    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    def attach(self, gateway: Any) -> None:
        """Called after every gateway start with the running gateway: a platform that
        calls the gateway (webhooks) learns its address here (``gateway.port``)."""

    def section(self, **overrides: Any) -> dict[str, Any]:
        """``channels.<name>`` pointing at the fake: DMs open, the test group allowlisted
        with ``require_mention``, ``streaming: off`` unless overridden."""
        raise NotImplementedError

    # -- inbound --------------------------------------------------------------------------
    async def dm(self, text: str) -> Any:
        """The test user DMs the bot; returns a handle for :meth:`redeliver`."""
        raise NotImplementedError

    async def group(self, text: str, *, mention: bool) -> Any:
        """The test user writes in the test group, @-mentioning the bot or not."""
        raise NotImplementedError

    async def dm_file(self, text: str, name: str, data: bytes, mime: str) -> Any:
        """The test user DMs a file (a document) with ``text``."""
        raise NotImplementedError

    async def redeliver(self, handle: Any) -> None:
        """Deliver the same inbound message again, as the platform does when it never
        saw an acknowledgement."""
        raise NotImplementedError

    # -- what the bot posted --------------------------------------------------------------
    def dm_texts(self) -> list[str]:
        """The bot's messages in the DM as the chat shows them now, in the platform's
        markup (as sent)."""
        raise NotImplementedError

    def group_texts(self) -> list[str]:
        raise NotImplementedError

    def plain(self, text: str) -> str:
        """``text`` as sent with the markup removed (HTML parsed, escapes undone)."""
        return text

    def length(self, text: str) -> int:
        """``text`` measured as the platform measures its limit."""
        return len(text)

    def dm_uploads(self) -> list[tuple[str, bytes]]:
        """``(filename, bytes)`` of every file the bot uploaded into the DM."""
        raise NotImplementedError

    def edit_count(self) -> int:
        """How many times the bot changed a posted message (0 without edits)."""
        return 0

    # -- faults ---------------------------------------------------------------------------
    async def outage(self, down: bool) -> None:
        """Take the platform down (sends fail with 5xx, the connection drops) or bring
        it back."""
        raise NotImplementedError


def drivers() -> list[ChannelDriver]:
    """Every ``DRIVER`` in tests/conformance/drivers/, by module name."""
    folder = Path(__file__).parent / "drivers"
    out = []
    for info in sorted(pkgutil.iter_modules([str(folder)]), key=lambda m: m.name):
        module = importlib.import_module(f"tests.conformance.drivers.{info.name}")
        out.append(module.DRIVER)
    return out
