"""Telegram attachments -> ``InboundMedia`` (photos: the largest size; documents, voice,
audio, video, video notes, stickers as images). A media group (album) arrives as several
updates sharing ``media_group_id``: the adapter hands each over with ``album_id`` set and
the gateway merges them into one turn after journaling each (gateway/inbound/albums.py).
Files are fetched with ``getFile`` and the file URL (Bot API: getFile, 20 MB download cap).
"""

from __future__ import annotations

from typing import Any

from telegram import Bot, Message

from channels.media import InboundMedia
from channels.media.download import fetch_capped


def fetcher_for(bot: Bot, file_id: str, name: str):
    """``fetch(max_bytes)`` for a file by its ``file_id`` (``getFile`` + the file URL)."""
    async def fetch(max_bytes: int) -> bytes:
        tg_file = await bot.get_file(file_id)
        # PTB gives the full download URL (base_file_url + token + path): never log it
        return await fetch_capped(str(tg_file.file_path), name=name, max_bytes=max_bytes)
    return fetch


def _sticker(message: Message) -> tuple[Any, str] | None:
    st = message.sticker
    if st is None:
        return None
    if not (st.is_animated or st.is_video):
        return st, f"sticker-{st.file_unique_id}.webp"
    if st.thumbnail is not None:  # animated/video stickers: their still thumbnail
        return st.thumbnail, f"sticker-{st.file_unique_id}.webp"
    return None


def media_of(message: Message, bot: Bot) -> list[InboundMedia]:
    """The attachments of one Telegram message (empty for plain text)."""
    found: list[tuple[str, Any, str, str | None]] = []  # kind, file object, name, mime
    if message.photo:
        big = message.photo[-1]
        found.append(("image", big, f"photo-{big.file_unique_id}.jpg", "image/jpeg"))
    if message.document is not None:
        d = message.document
        found.append(("document", d, d.file_name or f"document-{d.file_unique_id}",
                      d.mime_type))
    if message.voice is not None:
        v = message.voice
        found.append(("voice", v, f"voice-{v.file_unique_id}.ogg", v.mime_type))
    if message.audio is not None:
        a = message.audio
        found.append(("audio", a, a.file_name or f"audio-{a.file_unique_id}.mp3", a.mime_type))
    if message.video is not None:
        v = message.video
        found.append(("video", v, v.file_name or f"video-{v.file_unique_id}.mp4", v.mime_type))
    if message.video_note is not None:
        v = message.video_note
        found.append(("video", v, f"video-note-{v.file_unique_id}.mp4", "video/mp4"))
    sticker = _sticker(message)
    if sticker is not None:
        found.append(("sticker", sticker[0], sticker[1], "image/webp"))
    return [InboundMedia(kind=kind, name=name, size=getattr(obj, "file_size", None),
                         mime=mime, fetch=fetcher_for(bot, obj.file_id, name),
                         handle=obj.file_id)
            for kind, obj, name, mime in found]
