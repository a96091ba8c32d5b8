"""The ``media`` config section (issue 12): limits, images, audio transcription,
documents. Every key has its default here; config.example.yaml documents them."""


from pydantic import Field

from runtime.config_types import ConfigModel, Duration, section


class ImageSettings(ConfigModel):
    max_side: int = Field(1568, ge=64, le=8192,
        description=("images go to vision models downscaled to this many pixels on the longer side"
                     " (Pillow)"))  # px, longer side sent to vision models
    keep_turns: int = Field(3, ge=0,
        description=("images of the last N user turns are sent as images; older ones only by "
                     "reference."))  # user turns whose images stay images in the context


class TranscriptionSettings(ConfigModel):
    provider: str = Field(
        description=("a models.providers name with api openai (OpenAI, Groq, a local whisper "
                     "server)"))  # a models.providers name with api openai (OpenAI, Groq, whisper server)
    model: str = Field(
        "whisper-1",
        description="e.g. whisper-large-v3 on Groq.")
    language: str | None = Field(
        None,
        description="ISO-639-1 hint, e.g. en.")
    timeout: Duration = Field(
        120.0,
        description="Timeout of one transcription request.")


class AudioSettings(ConfigModel):
    transcription: TranscriptionSettings | None = Field(
        None,
        description=("voice/audio -> text through an OpenAI-compatible POST "
                     "/v1/audio/transcriptions."))


class DocumentSettings(ConfigModel):
    inline_max_bytes: int = Field(100 * 1024, ge=0,
        description=("text/code files up to this size are inlined into the message (fenced, name "
                     "quoted)"))
    pdf_max_chars: int = Field(30_000, ge=0,
        description="PDF text extracted with pypdf up to this many characters.")


class MediaSettings(ConfigModel):
    max_bytes: int = Field(20 * 1024 * 1024, ge=1024,
        description=("per file, in and out (20 MB); checked before download when the platform says"
                     " the size, and during it."))  # per file, in and out
    download_timeout: Duration = Field(
        60.0,
        description="timeout of one file download.")
    album_wait: Duration = Field(
        1.0,
        description=("Telegram albums arrive as several updates (each journaled): run one turn "
                     "once none came for this long."))  # Telegram media groups: wait this long for the rest
    image: ImageSettings = Field(
        section(),
        description="Images sent to vision models.")
    audio: AudioSettings = Field(
        section(),
        description="Voice notes and audio files.")
    documents: DocumentSettings = Field(
        section(),
        description="Text files and PDFs people send.")
