"""Provider slots: at most ``models.providers.<p>.max_concurrent`` model calls in flight
per provider (default unlimited), issue 9 "Capacity where it belongs".

Lane caps protect the host; a provider's own limit (rate limits, a local GPU server that
serves N requests at a time) is a property of the provider. A turn that finds its provider
saturated gives its lane-kind cap slot back while it waits (``TurnControl.cap_released``),
so turns on other providers, or doing other work, are not held up by it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog

log = structlog.get_logger(__name__)


class ProviderSlots:
    """Per-provider semaphores. ``limits`` maps a provider name to its max concurrent calls
    (None or missing: unlimited). Raises ValueError for a limit below 1."""

    def __init__(self, limits: dict[str, int | None] | None = None) -> None:
        self._sems: dict[str, asyncio.Semaphore] = {}
        self.limits: dict[str, int] = {}
        for name, limit in (limits or {}).items():
            if limit is None:
                continue
            if limit < 1:
                raise ValueError(f"models.providers.{name}.max_concurrent: must be >= 1")
            self.limits[name] = limit
            self._sems[name] = asyncio.Semaphore(limit)

    def in_use(self, name: str) -> int:
        """Calls of provider ``name`` holding a slot now (0 when unlimited)."""
        sem = self._sems.get(name)
        return self.limits[name] - sem._value if sem is not None else 0

    @asynccontextmanager
    async def hold(self, name: str, control: Any = None) -> AsyncIterator[None]:
        """Hold one slot of provider ``name`` for the block. When none is free and
        ``control`` (a ``runtime.lanes.TurnControl``) is given, its lane cap slot is
        released while waiting and taken again before the block runs."""
        sem = self._sems.get(name)
        if sem is None:
            yield
            return
        release_cap = getattr(control, "cap_released", None)
        if sem.locked() and release_cap is not None:
            log.debug("provider_slot_wait", provider=name, limit=self.limits[name])
            acquired = False
            try:
                async with release_cap():
                    await sem.acquire()
                    acquired = True
            except BaseException:
                if acquired:  # cancelled while re-taking the lane cap
                    sem.release()
                raise
        else:
            await sem.acquire()
        try:
            yield
        finally:
            sem.release()
