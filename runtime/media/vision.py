"""Which models see images, and turning stored image references into image parts per
model call (issue 12: ``vision`` per model, ``media.image.keep_turns``).

Built-in defaults (a model without a ``vision`` setting): every Anthropic Claude model
sees images; among OpenAI-compatible names those matching :func:`vision_name` do (GPT-4o/4.1/5,
o-series, Gemini, Claude via a router, Llava, Pixtral, Qwen-VL, Llama-vision, ...); any
other name is treated as text-only, because sending an image part to a text-only server is
a 400 error while a text note always works.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from runtime.providers.base import ChatMessage, ModelRequest

log = structlog.get_logger(__name__)

@functools.cache  # compiled by the first image a model is to see (issue 9, cold start)
def vision_name() -> re.Pattern[str]:
    """OpenAI-compatible model names that see images by default."""
    return re.compile(
        r"gpt-4o|gpt-4\.1|gpt-4-turbo|gpt-5|(^|/)o[134](-|$)|vision|gemini|claude|llava|pixtral"
        r"|[-_.]vl([-_.:]|$)|qwen2?\.?5?-?vl|minicpm-v|moondream|llama-?3\.2-?(11|90)b|llama-4"
        r"|gemma-?3|mistral-(small|medium)-3",
        re.IGNORECASE)


def default_vision(api: str, model: str) -> bool:
    """Built-in guess for a model without a ``vision`` setting (see module docstring)."""
    return api == "anthropic" or bool(vision_name().search(model))


@dataclass
class MediaPolicy:
    """Per-agent image handling for model calls.

    ``vision`` maps ``provider/model`` refs to an explicit setting; ``apis`` maps provider
    names to their api (openai|anthropic) for the defaults. ``max_side`` in pixels;
    ``keep_turns``: images of the newest N user messages are sent as images, older ones by
    reference only.
    """

    workspace: Path
    max_side: int = 1568
    keep_turns: int = 3
    vision: dict[str, bool] = field(default_factory=dict)
    apis: dict[str, str] = field(default_factory=dict)

    def sees_images(self, ref: str) -> bool:
        if ref in self.vision:
            return self.vision[ref]
        provider, _, model = ref.partition("/")
        return default_vision(self.apis.get(provider, "openai"), model)

    async def prepare(self, request: ModelRequest, ref: str) -> ModelRequest:
        """A copy of ``request`` whose user messages carry image parts (vision model,
        within ``keep_turns``) or a text note instead (older images, text-only model).
        Returns ``request`` itself when no message has an image."""
        msgs = request.messages
        if not any(m.media for m in msgs):
            return request
        vision = self.sees_images(ref)
        out = list(msgs)
        user_turns = 0
        for i in range(len(out) - 1, -1, -1):
            msg = out[i]
            if msg.role != "user":
                continue
            user_turns += 1
            if msg.media:
                out[i] = await self._message(msg, vision and user_turns <= self.keep_turns,
                                             vision)
        return dataclasses.replace(request, messages=out)

    async def _message(self, msg: ChatMessage, show: bool, vision: bool) -> ChatMessage:
        from runtime.media.images import encode_image  # Pillow work: loads with a first image
        images, notes = [], []
        for ref in msg.media:
            if ref.kind != "image":
                continue
            if show:
                try:
                    # Pillow work off the event loop; cached after the first call
                    images.append(await asyncio.to_thread(
                        encode_image, self.workspace / ref.path, ref.sha256, self.max_side))
                    continue
                except Exception as exc:  # noqa: BLE001 - a broken file becomes a note
                    log.warning("image_encode_failed", path=ref.path, error=str(exc))
                    notes.append(f"(image {ref.path} could not be read: {type(exc).__name__})")
                    continue
            why = ("an earlier turn's image, no longer shown" if vision
                   else "this model cannot see images")
            notes.append(f"(image not shown — {why}; the file is at {ref.path})")
        text = "\n".join([msg.content, *notes]) if notes else msg.content
        return dataclasses.replace(msg, content=text, images=images)
