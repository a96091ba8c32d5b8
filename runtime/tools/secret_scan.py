"""Whether bytes about to leave the gateway (a file to upload) hold a configured secret,
also when the file is encoded or compressed (runtime/tools/secrets.py ``names_in``).

Checked: the value as UTF-8, UTF-16 and UTF-32 (either byte order, with or without a
BOM); inside gzip, bzip2, xz/lzma and zip containers (nested up to :data:`MAX_DEPTH`
deep), decompressing at most :data:`MAX_INFLATE` bytes in all (a zip bomb costs no more).

Not checked (docs/exec.md "Secrets the model never sees"): other encodings (base64, hex,
URL or HTML escapes, rot13), a value split or interleaved, encrypted containers (a zip
with a password, gpg), other archive formats (7z, rar, zstd, brotli), images or PDFs
whose text is drawn or compressed inside the file, and anything past the inflate budget.
"""

from __future__ import annotations

import bz2
import io
import lzma
import zipfile
import zlib
from collections.abc import Iterable

MAX_INFLATE = 64 * 1024 * 1024
MAX_DEPTH = 3
MAX_ZIP_MEMBERS = 1000
_ENCODINGS = ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")


def encodings_of(value: str) -> list[bytes]:
    """``value``'s bytes in every checked text encoding."""
    return [value.encode(enc) for enc in _ENCODINGS]


class _Budget:
    """Bytes left to inflate, shared by every container of one scan."""

    def __init__(self, limit: int) -> None:
        self.left = limit


def _inflate_stream(data: bytes, budget: _Budget, make) -> bytes:
    """Concatenated members of a gzip/bz2/xz stream, at most ``budget.left`` bytes.
    Corrupt or truncated data yields what came out before the damage."""
    out = bytearray()
    rest = data
    while rest and budget.left > 0:
        d = make()
        try:
            chunk = d.decompress(rest, budget.left)
        except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error):
            break
        out += chunk
        budget.left -= len(chunk)
        if not getattr(d, "eof", False):
            break  # budget used up, or truncated
        rest = d.unused_data
    return bytes(out)


def _zip_members(data: bytes, budget: _Budget) -> list[bytes]:
    """The (bounded) contents of a zip's members; encrypted members are skipped."""
    found: list[bytes] = []
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for info in z.infolist()[:MAX_ZIP_MEMBERS]:
                if budget.left <= 0:
                    break
                if info.flag_bits & 0x1 or info.is_dir():
                    continue
                with z.open(info) as fh:
                    chunk = fh.read(budget.left)
                budget.left -= len(chunk)
                found.append(chunk)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError,
            RuntimeError, lzma.LZMAError, zlib.error):
        pass
    return found


def _unpacked(data: bytes, budget: _Budget) -> list[bytes]:
    """What ``data`` holds when it is a known container (its decompressed bytes), or []."""
    if data[:2] == b"\x1f\x8b":
        return [_inflate_stream(data, budget, lambda: zlib.decompressobj(16 + zlib.MAX_WBITS))]
    if data[:3] == b"BZh":
        return [_inflate_stream(data, budget, bz2.BZ2Decompressor)]
    if data[:6] == b"\xfd7zXZ\x00" or data[:1] == b"\x5d":
        return [_inflate_stream(data, budget, lzma.LZMADecompressor)]
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06") or (b"PK\x05\x06" in data[-65_557:]
                                                     and zipfile.is_zipfile(io.BytesIO(data))):
        return _zip_members(data, budget)
    return []


def holds(data: bytes, needles: Iterable[bytes], *, limit: int = MAX_INFLATE) -> set[bytes]:
    """The ``needles`` found in ``data`` or in what its containers hold (module
    docstring); never raises for malformed data."""
    wanted = [n for n in dict.fromkeys(needles) if n]
    found: set[bytes] = set()
    budget = _Budget(limit)
    todo = [(data, 0)]
    while todo and len(found) < len(wanted):
        blob, depth = todo.pop()
        found.update(n for n in wanted if n not in found and n in blob)
        if depth < MAX_DEPTH and budget.left > 0:
            todo += [(b, depth + 1) for b in _unpacked(blob, budget) if b]
    return found
