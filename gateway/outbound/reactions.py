"""Reactions as acknowledgements (issue 13): ``messages.ack_reaction`` (default 👀) on the
triggering message when its turn starts, removed when the turn ends, and
``messages.done_reaction`` (default none) set then. ``messages.ack_reaction_scope``, for
both: ``all`` | ``group-mentions`` (group turns — in a group that requires a mention,
every turn answers one) | ``dms`` | ``off``. A silent reply leaves no reaction. Reacting is best
effort: it runs beside the turn and a failure is logged at debug, never affecting the
reply. Adapters implement ``react(to, thread_id, message_id, emoji, remove=)``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_background: set[asyncio.Task] = set()


def ack_applies(scope: str, chat_type: str) -> bool:
    """Whether a turn in ``chat_type`` gets the ack reaction under ``scope``."""
    if scope == "all":
        return True
    if scope == "dms":
        return chat_type == "dm"
    if scope == "group-mentions":
        return chat_type != "dm"
    return False


class Acks:
    """The reactions of one turn's triggering message. ``channel`` is the adapter (None or
    one without ``react``: nothing happens)."""

    def __init__(self, channel: Any, route: Any, message_id: str | None, messages: Any,
                 chat_type: str) -> None:
        self.react = getattr(channel, "react", None) if message_id else None
        self.route, self.message_id = route, message_id
        applies = ack_applies(messages.ack_reaction_scope, chat_type)
        self.ack = messages.ack_reaction if applies else ""
        self.done = (messages.done_reaction or "") if applies else ""
        self._acked = False
        self._last: asyncio.Task | None = None

    def _spawn(self, emoji: str, remove: bool) -> None:
        if self.react is None or not emoji:
            return
        previous = self._last

        async def run() -> None:
            if previous is not None:  # keep add/remove in order
                await asyncio.gather(previous, return_exceptions=True)
            try:
                await self.react(self.route.to, self.route.thread, self.message_id, emoji,
                                 remove=remove)
            except Exception as exc:  # noqa: BLE001 - a reaction never affects the reply
                log.debug("reaction_failed", channel=self.route.channel, emoji=emoji,
                          remove=remove, error=f"{type(exc).__name__}: {exc}")

        self._last = task = asyncio.ensure_future(run())
        _background.add(task)
        task.add_done_callback(_background.discard)

    def started(self) -> None:
        """The turn starts: set the ack reaction."""
        self._acked = bool(self.ack and self.react)
        self._spawn(self.ack, remove=False)

    def ended(self, *, silent: bool) -> None:
        """The turn ended: remove the ack; set the done reaction unless the reply was
        silent."""
        if self._acked:
            self._spawn(self.ack, remove=True)
        if not silent:
            self._spawn(self.done, remove=False)
