"""Small real files for the media tests: JPEG/PNG made with Pillow, a hand-written PDF
with a text layer (pypdf extracts it), an Ogg page header (what sniffing looks at)."""

from __future__ import annotations

import base64
import io

from PIL import Image


def jpeg(width: int = 2000, height: int = 1500, color: tuple = (200, 40, 40)) -> bytes:
    img = Image.new("RGB", (width, height), color)
    for x in range(0, width, 50):  # some detail so the JPEG is not trivially small
        img.paste((x % 255, 90, 160), (x, 0, x + 10, height))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90)
    return out.getvalue()


def png(width: int = 64, height: int = 64) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", (width, height), (0, 128, 255, 200)).save(out, "PNG")
    return out.getvalue()


def tiny_pdf(text: str) -> bytes:
    """A one-page PDF whose content stream draws ``text`` in Helvetica."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
         b"/Resources << /Font << /F1 5 0 R >> >> >>"),
        (b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream
         + b"\nendstream"),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += (f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n"
            "%%EOF\n").encode()
    return bytes(out)


def ogg_voice() -> bytes:
    """An Ogg page carrying an OpusHead: enough for MIME sniffing and the fakes."""
    return b"OggS\x00\x02" + b"\x00" * 20 + b"OpusHead\x01\x01" + b"\x00" * 200


def image_parts(body: dict) -> list[bytes]:
    """Decoded image bytes of every OpenAI image_url part in a chat request."""
    out = []
    for m in body.get("messages") or []:
        if isinstance(m.get("content"), list):
            for p in m["content"]:
                if p.get("type") == "image_url":
                    url = p["image_url"]["url"]
                    assert url.startswith("data:image/"), url[:40]
                    out.append(base64.b64decode(url.split(",", 1)[1]))
    return out
