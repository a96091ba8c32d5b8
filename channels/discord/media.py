"""Files on Discord: message ``attachments`` -> ``InboundMedia`` (fetched from the
attachment's CDN ``url``; Discord announces ``size`` and ``content_type``), and uploads as
message attachments (``discord.File``; at most 10 per message)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import discord

from channels.media import InboundMedia
from channels.media.download import fetch_capped

MAX_FILES_PER_MESSAGE = 10


def media_of(message: discord.Message) -> list[InboundMedia]:
    """The attachments of a message, in order."""
    out = []
    for a in message.attachments:
        mime = a.content_type or ""
        kind = "image" if mime.startswith("image/") else "audio" if mime.startswith(
            "audio/") else "document"
        out.append(InboundMedia(kind=kind, name=a.filename, size=a.size, mime=mime or None,
                                fetch=_fetcher(a.url, a.filename)))
    return out


def _fetcher(url: str, name: str):
    async def fetch(max_bytes: int) -> bytes:
        return await fetch_capped(url, name=name, max_bytes=max_bytes)
    return fetch


async def send_files(channel: Any, files: list[str]) -> list[str]:
    """Upload ``files`` to ``channel`` (a Messageable), 10 per message; returns the new
    message ids. Raises discord/aiohttp errors (the caller maps them)."""
    ids = []
    for start in range(0, len(files), MAX_FILES_PER_MESSAGE):
        batch = [discord.File(f, filename=Path(f).name)
                 for f in files[start:start + MAX_FILES_PER_MESSAGE]]
        try:
            msg = await channel.send(files=batch)
        finally:
            for f in batch:
                f.close()
        ids.append(str(msg.id))
    return ids
