"""Inbound media: download what a message carries (under ``media.max_bytes``), store it in
the agent workspace inbox, and turn it into what the turn sees — references for images
(image parts at model-call time), transcripts for voice, inlined text for documents
(issue 12 "Media in"). Runs after the access policy: refused senders cost no download.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from channels.base import InboundMessage
from channels.media import InboundMedia, MediaTooLarge
from runtime.clock import Clock
from runtime.media.config import MediaSettings

# Storing, sniffing, encoding, transcribing and reading files load with the first message
# that carries one (issue 9: a gateway that only answers text never imports them).
if TYPE_CHECKING:
    from runtime.media.ref import MediaRef
    from runtime.media.transcribe import Transcriber

log = structlog.get_logger(__name__)

NO_TRANSCRIBER_HINT = (
    "I got your voice message, but voice transcription is not set up here, so I only see "
    "the audio file. (Operator: set media.audio.transcription in config.yaml.)")


@dataclass(slots=True)
class PreparedMedia:
    """The message text with attachment lines added, the stored references, and notices
    for the sender (refusals, the one-time transcription hint)."""

    text: str
    refs: list[MediaRef] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


class MediaIntake:
    """Per-gateway media ingestion. ``transcriber`` None: voice is kept as a file and the
    sender gets :data:`NO_TRANSCRIBER_HINT` once per chat (per gateway run)."""

    def __init__(self, settings: MediaSettings, clock: Clock,
                 transcriber: Transcriber | None = None, transcriber_key: tuple = ()) -> None:
        self.settings = settings
        self.clock = clock
        self.transcriber = transcriber
        self.transcriber_key = transcriber_key  # what the transcriber was built from
        self._hinted: set[tuple[str, str]] = set()
        self._transcribing = 0
        self._retired = False
        self._prewarms: set[asyncio.Future] = set()  # image encodings running on

    async def prepare(self, msg: InboundMessage, workspace: Path, *,
                      vision: bool = True) -> PreparedMedia:
        """Ingest every attachment of ``msg``; never raises for a bad file (the sender is
        told in ``notices``). ``vision``: the session's model takes images now, so images
        are encoded for it while they are written; a text-only model gets a note with the
        path at the model call and nothing is encoded."""
        out = PreparedMedia(text=msg.text)
        lines: list[str] = []
        for item in msg.media:
            ref = await self._fetch_and_store(item, workspace, out.notices, vision)
            if ref is None:
                continue
            out.refs.append(ref)
            lines += await self._describe(ref, item, workspace, msg, out.notices)
        out.text = "\n".join([t for t in (msg.text, *lines) if t])
        return out

    async def _fetch_and_store(self, item: InboundMedia, workspace: Path,
                               notices: list[str], vision: bool) -> MediaRef | None:
        limit = self.settings.max_bytes
        try:
            if item.size is not None and item.size > limit:
                raise MediaTooLarge(item.name, item.size, limit)
            async with asyncio.timeout(self.settings.download_timeout):
                data = await item.fetch(limit)
        except MediaTooLarge as exc:
            from runtime.media.ref import human_size
            log.warning("media_refused", reason="too_large", name=item.name, size=exc.size,
                        limit=limit)
            notices.append(f"Sorry, I can't take {item.kind} “{item.name}”: it is larger "
                           f"than the {human_size(limit)} limit.")
            return None
        except Exception as exc:  # noqa: BLE001 - one file must not drop the message
            log.warning("media_download_failed", name=item.name, kind=item.kind,
                        error=f"{type(exc).__name__}: {exc}"[:300])
            notices.append(f"Sorry, I couldn't download {item.kind} “{item.name}”.")
            return None
        ref = await self._store(workspace, data, item.name, vision)
        log.info("media_stored", path=ref.path, mime=ref.mime, size=ref.size,
                 announced_mime=item.mime, prewarmed=vision and ref.kind == "image")
        return ref

    async def _store(self, workspace: Path, data: bytes, name: str,
                     vision: bool) -> MediaRef:
        """Write the file (hash, sniff, atomic write + fsync). For an image a vision model
        will see, its encoding starts at the same time in a second thread and is not
        waited for: it runs on while the journal, the lane and the turn's context are
        prepared, and the model call waits only for what is left of it
        (``runtime/media/images.py`` shares one encoding between callers)."""
        from channels.media.sniff import kind_of, sniff_mime
        from channels.media.store import store_inbox
        from runtime.media.images import prewarm
        now = self.clock.time()
        if not vision or kind_of(sniff_mime(data, name)) != "image":
            return await asyncio.to_thread(store_inbox, workspace, data, name, now=now)
        sha = hashlib.sha256(data).hexdigest()
        job = prewarm(data, sha, self.settings.image.max_side)  # claimed before we return
        if job is not None:
            task = asyncio.get_running_loop().run_in_executor(None, job)
            self._prewarms.add(task)
            task.add_done_callback(self._prewarms.discard)
        return await asyncio.to_thread(store_inbox, workspace, data, name, now=now,
                                       digest=sha)

    async def _describe(self, ref: MediaRef, item: InboundMedia, workspace: Path,
                        msg: InboundMessage, notices: list[str]) -> list[str]:
        """Lines for the model about one stored file."""
        lines = [ref.label()]
        if ref.kind == "audio":
            lines += await self._transcript(ref, workspace, msg, notices)
        elif ref.kind == "document":
            from runtime.media.documents import document_text
            block = await asyncio.to_thread(
                document_text, workspace, ref,
                pdf_max_chars=self.settings.documents.pdf_max_chars,
                inline_max=self.settings.documents.inline_max_bytes)
            if block:
                lines.append(block)
        return lines

    async def _transcript(self, ref: MediaRef, workspace: Path, msg: InboundMessage,
                          notices: list[str]) -> list[str]:
        if self.transcriber is None:
            chat = (msg.channel, msg.group_id or msg.peer_id)
            if chat not in self._hinted:
                self._hinted.add(chat)
                notices.append(NO_TRANSCRIBER_HINT)
            return ["(voice message not transcribed: no transcriber is configured)"]
        from runtime.media.transcribe import TranscriptionError
        self._transcribing += 1
        try:
            text = await self.transcriber.transcribe(workspace / ref.path, ref.name)
        except TranscriptionError as exc:
            log.warning("transcription_failed", path=ref.path, error=str(exc))
            return [f"(voice message could not be transcribed: {exc})"]
        finally:
            self._transcribing -= 1
            if self._retired and not self._transcribing:
                await self.close()
        log.info("media_transcribed", path=ref.path, chars=len(text))
        return [f"[transcribed voice message] {text}"]

    async def close(self) -> None:
        transcriber, self.transcriber = self.transcriber, None
        if transcriber is not None:
            await transcriber.close()

    async def retire(self) -> None:
        """Replaced by a reload: close the transcriber now, or when the transcriptions
        still running finish."""
        self._retired = True
        if not self._transcribing:
            await self.close()


def _transcriber_key(cfg) -> tuple:
    tr = cfg.media.audio.transcription
    if tr is None:
        return ()
    prov = cfg.models.providers[tr.provider]
    return (tr, prov.base_url, prov.api_key)


def build_media_intake(cfg, clock: Clock) -> MediaIntake:
    """The MediaIntake for a config: a Transcriber when ``media.audio.transcription`` names
    a provider (its base_url and api_key are used)."""
    key = _transcriber_key(cfg)
    transcriber = None
    if key:
        from runtime.media.transcribe import Transcriber
        tr, base_url, api_key = key
        transcriber = Transcriber(base_url=base_url, api_key=api_key, model=tr.model,
                                  timeout=tr.timeout, language=tr.language)
    return MediaIntake(cfg.media, clock, transcriber, key)


async def reload_media_intake(old: MediaIntake, cfg, clock: Clock) -> MediaIntake:
    """A config reload: limits, image, document and album settings apply to the next
    message; the transcriber is rebuilt only when its settings or its provider's
    address/key changed (the old one is closed once its running transcriptions end)."""
    if _transcriber_key(cfg) == old.transcriber_key:
        old.settings = cfg.media
        return old
    new = build_media_intake(cfg, clock)
    new._hinted = old._hinted
    await old.retire()
    log.info("media_transcriber_rebuilt", configured=new.transcriber is not None)
    return new
