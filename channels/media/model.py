"""What an adapter knows about an attached file before anything is downloaded."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

# fetch(max_bytes) -> the file's bytes; raises MediaTooLarge past max_bytes
Fetch = Callable[[int], Awaitable[bytes]]


class MediaTooLarge(Exception):
    """A file is over ``media.max_bytes`` (``size`` known, or the cap crossed while
    downloading: then ``size`` is the number of bytes read so far)."""

    def __init__(self, name: str, size: int, limit: int) -> None:
        super().__init__(f"{name!r} is larger than the {limit} byte limit")
        self.name, self.size, self.limit = name, size, limit


@dataclass(slots=True)
class InboundMedia:
    """One file attached to an inbound message.

    ``kind``: image | audio | voice | video | document | sticker (the platform's view; the
    stored kind comes from the sniffed bytes). ``name`` is the sender's file name or a
    generated one; ``size`` the byte count the platform announced (None: unknown);
    ``mime`` the platform's claim (not trusted). ``fetch`` downloads it under a cap.
    ``handle``: the platform's lasting id for the file (Telegram ``file_id``), from which
    the adapter's ``media_fetch(handle, name)`` makes ``fetch`` again after a restart.
    """

    kind: str
    name: str
    fetch: Fetch
    size: int | None = None
    mime: str | None = None
    handle: str | None = None
