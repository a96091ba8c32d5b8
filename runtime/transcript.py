"""JSONL session transcripts, shaped like OpenClaw's v3 session files (DESIGN.md
"Files on disk"; seed 003 §2.2).

Line 1 is a header ``{"type": "session", "version": 3, "id": <session_id>, "timestamp",
"session_key", "cwd"}``. Every later line is an entry with ``type`` (``message`` |
``compaction`` | ...), ``id`` (8 hex chars), ``parentId`` (previous entry's id, None for the
first) and ``timestamp`` (RFC 3339 UTC, ms). Message entries carry ``message: {role:
user|assistant|toolResult, content: [...], timestamp: <epoch ms>, ...}``.

The file is append-only: one ``write(2)`` per line on an ``O_APPEND`` descriptor, so a
crash loses at most the line being written, and earlier lines are never rewritten. A torn
last line (no newline) is left as it is and the next append starts on a fresh line.
Readers take the tail without reading the whole file and skip (and report) invalid lines.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from runtime.clock import SYSTEM_CLOCK, Clock, parse_iso, utc_iso
from runtime.ids import unique_hex

log = structlog.get_logger(__name__)

TRANSCRIPT_VERSION = 3
_RECOVER_BYTES = 64 * 1024


def new_entry_id() -> str:
    return unique_hex(8)


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


@dataclass(slots=True)
class TailResult:
    """Entries of a transcript tail in file order, plus what was skipped.

    ``skipped`` lists ``(byte_offset, reason)``; ``header`` is the session header when the
    tail reached the start of the file; ``complete`` is True when the whole file was read.
    """

    entries: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    header: dict[str, Any] | None = None
    complete: bool = False


def read_tail(path: Path, max_bytes: int = 4 * 1024 * 1024) -> TailResult:
    """Read at most the last ``max_bytes`` of a transcript and parse its complete lines.

    A first line cut by the window is dropped; torn or invalid lines are skipped with a
    warning (never fatal). Missing file -> empty result.
    """
    result = TailResult()
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        result.complete = True
        return result
    with fh:
        size = os.fstat(fh.fileno()).st_size
        start = max(0, size - max_bytes)
        fh.seek(start)
        data = fh.read()
    result.complete = start == 0
    offset = start
    lines = data.split(b"\n")
    if start > 0 and lines:
        offset += len(lines[0]) + 1
        lines = lines[1:]
    for i, raw in enumerate(lines):
        line_off = offset
        offset += len(raw) + 1
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict) or "type" not in obj:
                raise ValueError("not an entry object")
        except ValueError as exc:
            torn = i == len(lines) - 1
            reason = "torn last line" if torn else f"invalid line: {exc}"
            result.skipped.append((line_off, reason))
            continue
        if obj.get("type") == "session":
            result.header = obj
            continue
        result.entries.append(obj)
    _fill_times(result, path)
    if result.skipped:
        log.warning("transcript_lines_skipped", path=str(path), count=len(result.skipped),
                    first_offset=result.skipped[0][0], reason=result.skipped[0][1])
    return result


def _fill_times(result: TailResult, path: Path) -> None:
    """Give entries of old transcripts the times they lack, in memory only (seed 002: old
    files still load). An entry without ``timestamp`` takes its message's epoch-ms
    ``timestamp``, else the previous entry's (or the header's), else the next one's (times
    never decrease), else the file's mtime; a message without ``timestamp`` takes its
    entry's. The file itself is never rewritten."""

    def iso(value: Any) -> str | None:
        if isinstance(value, str) and value:
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return utc_iso(value / 1000 if value > 1e11 else value)
        return None

    def msg_of(entry: dict[str, Any]) -> dict[str, Any] | None:
        m = entry.get("message")
        return m if isinstance(m, dict) else None

    known = [iso(e.get("timestamp")) or iso((msg_of(e) or {}).get("timestamp"))
             for e in result.entries]
    prev = iso(result.header.get("timestamp")) if result.header else None
    nxt = next((t for t in known if t), None)
    if prev is None and nxt is None:
        try:
            prev = utc_iso(os.stat(path).st_mtime)
        except OSError:
            prev = utc_iso(0)
    for entry, ts in zip(result.entries, known):
        ts = ts or prev or nxt
        entry["timestamp"] = prev = ts
        msg = msg_of(entry)
        if msg is not None and not isinstance(msg.get("timestamp"), (int, float)):
            try:
                msg["timestamp"] = int(parse_iso(ts) * 1000)
            except ValueError:
                msg["timestamp"] = 0
    if result.header is not None and not iso(result.header.get("timestamp")):
        result.header["timestamp"] = (result.entries[0]["timestamp"] if result.entries
                                      else prev or nxt)


def iter_entries_reversed(path: Path, chunk: int = 256 * 1024,
                          max_bytes: int = 64 * 1024 * 1024):
    """Yield ``(entry, None)`` for each valid entry from the end of the file backwards,
    reading ``chunk`` bytes at a time, so a reader that has what it needs stops early
    (the cost depends on what is read, not on the file's size). Invalid or torn lines
    yield ``(None, reason)``; the session header is skipped. Reads at most ``max_bytes``.
    """
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        pos = os.fstat(fh.fileno()).st_size
        floor = max(0, pos - max_bytes)
        carry = b""
        last = True
        while pos > floor:
            step = min(chunk, pos - floor)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + carry
            lines = data.split(b"\n")
            carry = lines[0] if pos > floor else b""
            body = lines[1:] if pos > floor else lines
            for i in range(len(body) - 1, -1, -1):
                raw = body[i]
                if not raw.strip():
                    last = False
                    continue
                try:
                    obj = json.loads(raw)
                    if not isinstance(obj, dict) or "type" not in obj:
                        raise ValueError("not an entry object")
                except ValueError as exc:
                    yield None, "torn last line" if last else f"invalid line: {exc}"
                    last = False
                    continue
                last = False
                if obj.get("type") != "session":
                    yield obj, None


class TranscriptWriter:
    """Appends entries to one session's transcript file.

    ``open()`` writes the header for a new file, or recovers the last entry id of an existing
    one. Each ``append`` is a single write of one JSON line, or, between ``hold()`` and
    ``flush()``, part of one write of all the lines held.
    """

    def __init__(self, path: Path, *, session_id: str, session_key: str,
                 clock: Clock = SYSTEM_CLOCK, cwd: str | None = None) -> None:
        self.path = path
        self.session_id = session_id
        self.session_key = session_key
        self.clock = clock
        self.cwd = cwd
        self.last_id: str | None = None
        self._fd: int | None = None
        self._needs_newline = False
        self._held: list[bytes] | None = None  # batching: lines not yet written

    def open(self) -> TranscriptWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        size = os.fstat(self._fd).st_size
        if size == 0:
            header = {"type": "session", "version": TRANSCRIPT_VERSION, "id": self.session_id,
                      "timestamp": utc_iso(self.clock.time()), "session_key": self.session_key}
            if self.cwd:
                header["cwd"] = self.cwd
            os.write(self._fd, _dumps(header))
        else:
            self._recover(size)
        return self

    def _recover(self, size: int) -> None:
        with open(self.path, "rb") as fh:
            fh.seek(max(0, size - _RECOVER_BYTES))
            data = fh.read()
        self._needs_newline = not data.endswith(b"\n")
        for raw in reversed(data.split(b"\n")):
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") != "session" and obj.get("id"):
                self.last_id = str(obj["id"])
                return

    def append(self, entry_type: str, body: dict[str, Any], *,
               timestamp: float | None = None) -> dict[str, Any]:
        """Append one entry (``type``, ``id``, ``parentId``, ``timestamp`` + ``body``) and
        return it. Raises OSError if the write fails (nothing partial is left behind
        beyond what the OS wrote)."""
        if self._fd is None:
            self.open()
        ts = self.clock.time() if timestamp is None else timestamp
        entry = {"type": entry_type, "id": new_entry_id(), "parentId": self.last_id,
                 "timestamp": utc_iso(ts), **body}
        data = _dumps(entry)
        if self._needs_newline:
            data = b"\n" + data
            self._needs_newline = False
        if self._held is not None:
            self._held.append(data)
        else:
            assert self._fd is not None
            os.write(self._fd, data)
        self.last_id = entry["id"]
        return entry

    def hold(self) -> None:
        """Start batching: later appends are kept in memory until :meth:`flush` (issue 9:
        a turn's lines go out in one write)."""
        if self._held is None:
            self._held = []

    def flush(self, *, end: bool = False) -> None:
        """Write the held lines with a single ``write(2)`` (O_APPEND: never interleaved
        with another writer's line); ``end`` stops batching. Raises OSError."""
        held = self._held
        if end:
            self._held = None
        elif held is not None:
            self._held = []
        if held:
            if self._fd is None:
                self.open()
            assert self._fd is not None
            os.write(self._fd, b"".join(held))

    def append_message(self, message: dict[str, Any]) -> dict[str, Any]:
        """Append a ``message`` entry; ``message`` must have ``role`` and ``timestamp`` (ms)."""
        return self.append("message", {"message": message},
                           timestamp=message.get("timestamp", 0) / 1000.0 or None)

    def close(self) -> None:
        self.flush(end=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
