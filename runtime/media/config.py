"""The ``media`` config section (issue 12): limits, images, audio transcription,
documents. Every key has its default here; config.example.yaml documents them."""


from pydantic import Field

from runtime.config_types import ConfigModel, Duration, section


class ImageSettings(ConfigModel):
    max_side: int = Field(1568, ge=64, le=8192)  # px, longer side sent to vision models
    keep_turns: int = Field(3, ge=0)  # user turns whose images stay images in the context


class TranscriptionSettings(ConfigModel):
    provider: str  # a models.providers name with api openai (OpenAI, Groq, whisper server)
    model: str = "whisper-1"
    language: str | None = None
    timeout: Duration = 120.0


class AudioSettings(ConfigModel):
    transcription: TranscriptionSettings | None = None


class DocumentSettings(ConfigModel):
    inline_max_bytes: int = Field(100 * 1024, ge=0)
    pdf_max_chars: int = Field(30_000, ge=0)


class MediaSettings(ConfigModel):
    max_bytes: int = Field(20 * 1024 * 1024, ge=1024)  # per file, in and out
    download_timeout: Duration = 60.0
    album_wait: Duration = 1.0  # Telegram media groups: wait this long for the rest
    image: ImageSettings = section()
    audio: AudioSettings = section()
    documents: DocumentSettings = section()
