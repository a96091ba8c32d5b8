"""MIME type from the bytes themselves (magic numbers), never from the file name the sender
chose (issue 12). Covers what chat platforms carry: images, audio/voice, video, PDF,
office/zip containers, and text (UTF-8 without NULs)."""

from __future__ import annotations

_MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"%PDF-", 0, "application/pdf"),
    (b"OggS", 0, "audio/ogg"),
    (b"fLaC", 0, "audio/flac"),
    (b"\x1aE\xdf\xa3", 0, "video/webm"),
    (b"PK\x03\x04", 0, "application/zip"),
    (b"\x1f\x8b", 0, "application/gzip"),
)
BMP_DIB_SIZES = {12, 16, 40, 52, 56, 64, 108, 124}  # BITMAPCOREHEADER .. BITMAPV5HEADER
TEXT_SUBTYPES = {".md": "text/markdown", ".csv": "text/csv", ".json": "application/json",
                 ".html": "text/html", ".htm": "text/html", ".xml": "text/xml",
                 ".yaml": "text/yaml", ".yml": "text/yaml"}


def sniff_mime(data: bytes, name: str = "") -> str:
    """The MIME type of ``data``. ``name`` only refines a type the bytes already prove
    (text/plain -> text/markdown for ``.md``); it never makes binary data text."""
    for magic, offset, mime in _MAGIC:
        if data[offset:offset + len(magic)] == magic:
            return mime
    # two- and three-byte magics are common text starts ("BMI ...", "ID3 tags"): their
    # next header fields must fit too (BMP: reserved zeros + DIB size; ID3v2: version)
    if data[:2] == b"BM" and data[6:10] == b"\0\0\0\0" and int.from_bytes(
            data[14:18], "little") in BMP_DIB_SIZES:
        return "image/bmp"
    if data[:3] == b"ID3" and data[3:4] in (b"\x02", b"\x03", b"\x04"):
        return "audio/mpeg"
    riff = data[:4] == b"RIFF" and data[8:12]
    if riff == b"WEBP":
        return "image/webp"
    if riff == b"WAVE":
        return "audio/wav"
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        if brand in (b"M4A ", b"M4B "):
            return "audio/mp4"
        if brand in (b"heic", b"heix", b"mif1"):
            return "image/heic"
        return "video/mp4"
    if len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0:
        return "audio/mpeg"  # MPEG audio frame sync without an ID3 tag
    if is_text(data):
        ext = "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""
        return TEXT_SUBTYPES.get(ext, "text/plain")
    return "application/octet-stream"


def is_text(data: bytes) -> bool:
    """UTF-8 without NUL bytes in the first 8 KB (a cut multi-byte tail is allowed)."""
    head = data[:8192]
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3 and len(head) == 8192
    return True


def kind_of(mime: str, announced: str = "") -> str:
    """Stored kind (runtime/media/ref.py KINDS) from the sniffed type; a sticker or photo
    the platform announced stays an image only when the bytes are one."""
    top = mime.split("/", 1)[0]
    if top in ("image", "audio", "video"):
        return top
    return "document"
