"""Cancelling a background task without swallowing the caller's own cancellation.

The usual ``task.cancel(); with suppress(CancelledError): await task`` (or ``except
CancelledError: pass``) has a trap: when the *caller* is cancelled while it waits — the
gateway giving up on a ``stop()`` that takes too long (gateway/channels/stopping.py), a
receive loop being cancelled — the caller's CancelledError is swallowed too and it carries
on as if nothing happened (a reconnect loop retries forever, a stop never ends).
:func:`cancel_and_wait` swallows only the task's own ending.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` and wait until it has ended; its cancellation and its errors are
    swallowed (retrieved). Raises CancelledError only when the calling task itself is
    being cancelled (``Task.cancelling()``), which it must then let through. None or a
    finished task: nothing to wait for."""
    if task is None:
        return
    if not task.done():
        task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:  # noqa: BLE001, S110 - its error ends with it; the caller stops it
        pass
