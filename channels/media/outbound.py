"""Files out: which native upload a file gets and each platform's size limit, checked
before anything is sent so the model gets a clear error (issue 12 "Files out").

Limits: Telegram Bot API 10 MB for sendPhoto, 50 MB for other uploads; Slack 1 GB per
file (files.getUploadURLExternal); Discord 10 MB per attachment for bots without a boosted
server; WhatsApp Cloud API 5 MB per image, 16 MB per audio, 100 MB per document."""

from __future__ import annotations

from pathlib import Path

from channels.media.sniff import sniff_mime
from channels.outbound.delivery import ChunkDeliveryResult
from runtime.media.ref import human_size

MB = 1024 * 1024
LIMITS: dict[str, dict[str, int]] = {
    "telegram": {"photo": 10 * MB, "default": 50 * MB},
    "slack": {"default": 1024 * MB},
    "discord": {"default": 10 * MB},
    "whatsapp": {"photo": 5 * MB, "voice": 16 * MB, "default": 100 * MB},
    "matrix": {"default": 50 * MB},  # Synapse's default max_upload_size
}
PHOTO_TYPES = {"image/jpeg", "image/png", "image/webp", "image/gif"}


def upload_kind(path: Path) -> tuple[str, str]:
    """(kind, mime) of a file to send: ``photo`` for common images, ``voice`` for an Ogg
    file (Opus voice notes), else ``document``. Reads the first 8 KB."""
    with open(path, "rb") as fh:
        mime = sniff_mime(fh.read(8192), path.name)
    if mime in PHOTO_TYPES:
        return "photo", mime
    if mime == "audio/ogg":
        return "voice", mime
    return "document", mime


def upload_problem(channel: str, path: Path) -> str | None:
    """Why ``path`` cannot be sent on ``channel`` (missing, a directory, over the limit), or
    None. Limits of unknown channels are not judged."""
    if not path.is_file():
        return f"{path.name}: not a file"
    limits = LIMITS.get(channel)
    if limits is None:
        return None
    kind, _ = upload_kind(path)
    limit = limits.get(kind, limits["default"])
    size = path.stat().st_size
    if size > limit:
        return (f"{path.name} is {human_size(size)}; {channel} accepts at most "
                f"{human_size(limit)} for a {kind}")
    return None


def files_failed(sent_ids: list[str], remaining: list[str], error: str,
                 retryable: bool) -> ChunkDeliveryResult:
    """The result of a send whose text went out but whose files stopped at ``remaining``
    (the outbox then retries only those files, never the text again)."""
    return ChunkDeliveryResult(ok=False, message_ids=list(sent_ids), error=error,
                               retryable=retryable, chunks_sent=len(sent_ids),
                               remaining_media=list(remaining))
