"""Voice/audio transcription through an OpenAI-compatible ``POST /v1/audio/transcriptions``
(OpenAI, Groq, local whisper servers; issue 12 ``media.audio.transcription``), with the
official ``openai`` SDK: one client per transcriber, SDK retries off."""

from __future__ import annotations

from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


class TranscriptionError(Exception):
    """The transcription call failed (message has no API key)."""


class Transcriber:
    """``await transcribe(path, name)`` -> text. ``base_url`` includes ``/v1``;
    ``timeout`` seconds per call."""

    def __init__(self, *, base_url: str | None, api_key: str | None, model: str,
                 timeout: float = 120.0, language: str | None = None) -> None:
        import openai

        self.model = model
        self.language = language
        self._key = api_key or "not-needed"
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=self._key,
                                          max_retries=0, timeout=timeout)

    async def transcribe(self, path: Path, name: str) -> str:
        """The spoken text of the audio file at ``path``. Raises TranscriptionError."""
        import openai

        data = path.read_bytes()
        kwargs = {"language": self.language} if self.language else {}
        try:
            result = await self._client.audio.transcriptions.create(
                model=self.model, file=(name or path.name, data), **kwargs)
        except openai.OpenAIError as exc:
            detail = str(exc).replace(self._key, "***") if len(self._key) >= 4 else str(exc)
            raise TranscriptionError(f"transcription failed: {detail[:300]}") from None
        text = getattr(result, "text", None)
        return (text if isinstance(text, str) else str(result)).strip()

    async def close(self) -> None:
        await self._client.close()
