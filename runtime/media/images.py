"""Images for vision models: downscale with Pillow to ``media.image.max_side`` and encode
as base64 (issue 12; OpenAI ``image_url`` data URLs, Anthropic ``image`` blocks).

Encodings are cached by (path, sha256, max_side): a session's images are encoded once, not
on every model call of every turn.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Pillow is imported on first use (gateway start stays fast)
    from PIL import Image

PASSTHROUGH = {"image/jpeg", "image/png", "image/gif", "image/webp"}


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image ready for a provider: ``mime`` (image/jpeg|png|gif|webp) and base64 ``data``."""

    mime: str
    data: str

    @property
    def data_url(self) -> str:
        return f"data:{self.mime};base64,{self.data}"


def encode_image(path: Path, sha256: str, max_side: int) -> ImagePart:
    """The image at ``path`` with its longer side at most ``max_side`` px, EXIF rotation
    applied; a small JPEG/PNG/GIF/WebP is sent unchanged. Raises OSError (missing file) or
    PIL.UnidentifiedImageError (not an image)."""
    return _encode(str(path), sha256, max_side)


@lru_cache(maxsize=64)
def _encode(path: str, sha256: str, max_side: int) -> ImagePart:
    from PIL import Image

    raw = Path(path).read_bytes()
    with Image.open(io.BytesIO(raw)) as img:
        fmt = (img.format or "").lower()
        mime = f"image/{'jpeg' if fmt in ('jpeg', 'mpo') else fmt}"
        if max(img.size) <= max_side and mime in PASSTHROUGH and not _rotated(img):
            return ImagePart(mime, base64.b64encode(raw).decode("ascii"))
        return _downscale(img, max_side)


def _rotated(img: Image.Image) -> bool:
    return img.getexif().get(0x0112, 1) not in (1, None)


def _downscale(img: Image.Image, max_side: int) -> ImagePart:
    from PIL import Image, ImageOps

    # JPEG: let the decoder scale by 1/2, 1/4 or 1/8 (DCT scaling) before anything is
    # decoded at full size — the bulk of the time for a 12 MP photo.
    scale = max_side / max(img.size)
    img.draft("RGB", (int(img.size[0] * scale), int(img.size[1] * scale)))
    img = ImageOps.exif_transpose(img)
    img.thumbnail((max_side, max_side), Image.Resampling.LANCZOS, reducing_gap=2.0)
    out = io.BytesIO()
    if img.mode in ("RGBA", "LA", "P"):
        img.save(out, "PNG", optimize=False)
        mime = "image/png"
    else:
        img.convert("RGB").save(out, "JPEG", quality=85)
        mime = "image/jpeg"
    return ImagePart(mime, base64.b64encode(out.getvalue()).decode("ascii"))
