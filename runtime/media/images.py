"""Images for vision models: downscale with Pillow to ``media.image.max_side`` and encode
as base64 (issue 12; OpenAI ``image_url`` data URLs, Anthropic ``image`` blocks).

Encodings are cached by (sha256, max_side): a session's images are encoded once, not on
every model call of every turn, and the first encoding starts at intake (:func:`prewarm`,
while the file is written), so an image turn does not wait for it at the model call.
"""

from __future__ import annotations

import base64
import io
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:  # Pillow is imported on first use (gateway start stays fast)
    from PIL import Image

log = structlog.get_logger(__name__)

PASSTHROUGH = {"image/jpeg", "image/png", "image/gif", "image/webp"}


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image ready for a provider: ``mime`` (image/jpeg|png|gif|webp) and base64 ``data``."""

    mime: str
    data: str

    @property
    def data_url(self) -> str:
        return f"data:{self.mime};base64,{self.data}"


CACHE_SIZE = 64  # encodings kept (a 1568 px JPEG part is ~300-400 KB of base64)
_cache: OrderedDict[tuple[str, int], ImagePart] = OrderedDict()
_inflight: dict[tuple[str, int], Future] = {}
_lock = threading.Lock()


def encode_image(path: Path, sha256: str, max_side: int) -> ImagePart:
    """The image at ``path`` with its longer side at most ``max_side`` px, EXIF rotation
    applied; a small JPEG/PNG/GIF/WebP is sent unchanged. Cached by (sha256, max_side):
    the bytes, not the path, decide; an encoding :func:`prewarm` has started is waited
    for, not repeated. Raises OSError (missing file) or PIL.UnidentifiedImageError (not
    an image). Blocking: call it in a thread."""
    return _encoded((sha256, max_side), lambda: Path(path).read_bytes())


def prewarm(data: bytes, sha256: str, max_side: int) -> Callable[[], None] | None:
    """Claim the encoding of ``data`` now, in the caller's thread (at intake, while the
    file is written), and return the job that makes it — to run in a worker thread — or
    None when it is cached or already being made. From the claim on, a model call's
    :func:`encode_image` waits for this encoding instead of starting its own, even if the
    job has not started yet. The job never raises: a bad image is reported when the model
    call asks for it (it then encodes from the file itself)."""
    key = (sha256, max_side)
    with _lock:
        if key in _cache or key in _inflight:
            return None
        fut = _inflight[key] = Future()

    def job() -> None:
        try:
            _fill(key, fut, lambda: data)
        except Exception as exc:  # noqa: BLE001 - see docstring
            log.debug("image_prewarm_failed", error=f"{type(exc).__name__}: {exc}"[:200])
    return job


def cache_clear() -> None:
    with _lock:
        _cache.clear()


def _encoded(key: tuple[str, int], read: Callable[[], bytes]) -> ImagePart:
    while True:
        with _lock:
            hit = _cache.get(key)
            if hit is not None:
                _cache.move_to_end(key)
                return hit
            fut = _inflight.get(key)
            if fut is None:
                fut = _inflight[key] = Future()
                break
        try:
            return fut.result()
        except Exception:  # noqa: BLE001, S112 - that attempt failed: make our own
            continue
    return _fill(key, fut, read)


def _fill(key: tuple[str, int], fut: Future, read: Callable[[], bytes]) -> ImagePart:
    """Make the encoding ``fut`` (registered in ``_inflight``) stands for."""
    try:
        part = _encode_bytes(read(), key[1])
    except BaseException as exc:
        with _lock:
            if _inflight.get(key) is fut:
                del _inflight[key]
        fut.set_exception(exc)
        raise
    with _lock:
        _cache[key] = part
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
        if _inflight.get(key) is fut:
            del _inflight[key]
    fut.set_result(part)
    return part


def _encode_bytes(raw: bytes, max_side: int) -> ImagePart:
    from PIL import Image

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
    # decoded at full size — the bulk of the time for a 12 MP photo — and keep YCbCr
    # (no colour conversion on the way in, none on the way out: JPEG stores YCbCr).
    scale = max_side / max(img.size)
    img.draft("YCbCr", (int(img.size[0] * scale), int(img.size[1] * scale)))
    img = ImageOps.exif_transpose(img)
    # HAMMING: Pillow's resize is antialiased for every filter; for the <= 2x step left
    # after DCT scaling it is as sharp as BICUBIC at half the cost (bench/media_bench.py).
    img.thumbnail((max_side, max_side), Image.Resampling.HAMMING)
    out = io.BytesIO()
    if img.mode in ("RGBA", "LA", "P"):
        img.save(out, "PNG", optimize=False)
        mime = "image/png"
    else:
        (img if img.mode in ("RGB", "YCbCr", "L") else img.convert("RGB")).save(
            out, "JPEG", quality=85)
        mime = "image/jpeg"
    return ImagePart(mime, base64.b64encode(out.getvalue()).decode("ascii"))
