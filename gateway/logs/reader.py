"""Reading ``logs/gateway.jsonl``: ``tidegate logs [-f] [--level L] [--session KEY] [--json]``.

The tail is read backwards from the end of the file in 64 KiB blocks (a 1 GB log costs
what its last few hundred lines cost) and continues into the rotated ``gateway.jsonl.1``,
``.2``... only when the current file holds fewer matching lines than asked for. Follow
mode polls the open file for appended bytes and notices rotation (the path now names a
different inode: the old file is drained first, then the new one read from its start) and
truncation (size below our offset: read again from 0). A line that is not a JSON object
(torn write, foreign text) is printed raw, whatever the filters — it is a sign of trouble
worth seeing.
Filters and rendering: gateway/logs/records.py.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from gateway.logs.records import LogFilter, format_record, parse_line

_BLOCK = 64 * 1024
# Longest line kept whole when reading backwards; longer runs without a newline (NUL blocks
# a crash can leave behind) come out in pieces so memory stays bounded.
_MAX_LINE = 1024 * 1024
_MAX_BACKUPS = 100  # gateway.jsonl.1 .. .N; stop at the first missing one anyway


def read_logs(path: Path | str, *, follow: bool = False, level: str | None = None,
              session: str | None = None, as_json: bool = False, out: TextIO | None = None,
              lines: int = 200, poll_interval: float = 0.25,
              stop: threading.Event | None = None, utc: bool = False,
              since: float | None = None, until: float | None = None,
              event: str | None = None, channel: str | None = None) -> int:
    """Print the last ``lines`` matching lines of ``path``; with ``follow`` keep printing
    new ones until ``stop`` is set (or KeyboardInterrupt). Returns the number printed.

    ``level``: minimum level (debug|info|warning|error|critical); ``session``: session key
    or key prefix; ``event``/``channel``: event name or channel, exact or prefix; ``as_json``: print the raw JSON lines instead of the readable form.
    ``poll_interval`` is in seconds. ``out`` defaults to ``sys.stdout``. ``utc``: readable
    times in UTC instead of local time; ``since``/``until``: epoch seconds bounds.

    Raises FileNotFoundError when the file does not exist and ``follow`` is false
    (following waits for it to appear), ValueError for a bad level or negative ``lines``.
    """
    if lines < 0:
        raise ValueError("lines must be >= 0")
    filt = LogFilter.build(level, session, since, until, event=event, channel=channel)
    out = sys.stdout if out is None else out
    path = Path(path)
    emit = _Printer(out, filt, as_json=as_json, utc=utc)
    opened = _open_and_tail(path, follow, lines, filt, emit, poll_interval, stop)
    if opened is None:
        return 0  # stopped while waiting for the file to appear
    f, pos = opened
    out.flush()
    if follow:
        _follow(f, path, pos, emit, out, poll_interval, stop)  # closes f
    else:
        f.close()
    return emit.printed


class _Printer:
    """Prints a raw log line that passes the filter (readable, or as JSON), counting them.
    A line that is not a JSON object is printed raw whatever the filters."""

    def __init__(self, out: TextIO, filt: LogFilter, *, as_json: bool, utc: bool) -> None:
        self.out, self.filt, self.as_json, self.utc = out, filt, as_json, utc
        self.color = not as_json and _isatty(out)
        self.printed = 0

    def __call__(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        record = parse_line(text)
        if record is None:
            text = text.replace("\x00", "")  # NUL runs: what a crash leaves, not content
        if not text.strip() or not self.filt.matches(record):
            return
        self.out.write((text if self.as_json or record is None else
                        format_record(record, color=self.color, utc=self.utc)) + "\n")
        self.printed += 1


def _open_and_tail(path: Path, follow: bool, lines: int, filt: LogFilter,
                   emit: _Printer, poll_interval: float,
                   stop: threading.Event | None) -> tuple[BinaryIO, int] | None:
    """Open the log and print its last ``lines`` matching lines; returns the open file and
    the offset to follow from (None: stopped while waiting for the file to appear).
    Raises FileNotFoundError for a missing file when not following."""
    f = _open_or_none(path)
    if f is None:
        if not follow:
            raise FileNotFoundError(f"no log file at {path}")
        f = _wait_for(path, poll_interval, stop)
        return None if f is None else (f, 0)
    try:
        size = os.fstat(f.fileno()).st_size
        # While following, start after the last complete line: a line being written
        # now is printed once it is whole.
        pos = _end_of_last_line(f, size) if follow else size
        for raw in _tail(f, pos, path, lines, filt):
            emit(raw)
    except BaseException:
        f.close()
        raise
    return f, pos


# --- tail -----------------------------------------------------------------------------

def _tail(f: BinaryIO, end: int, path: Path, want: int, filt: LogFilter) -> list[bytes]:
    """The last ``want`` matching raw lines before ``end`` (oldest first), continuing into
    rotated backups when the current file has too few."""
    if want == 0:
        return []
    picked: list[bytes] = []
    for src, src_end, owned in _sources(f, end, path):
        try:
            for raw in _reverse_lines(src, src_end):
                text = raw.decode("utf-8", "replace")
                if text.replace("\x00", "").strip() and filt.matches(parse_line(text)):
                    picked.append(raw)
                    if len(picked) >= want:
                        break
        finally:
            if owned:
                src.close()
        if len(picked) >= want:
            break
    picked.reverse()
    return picked


def _sources(f: BinaryIO, end: int, path: Path) -> Iterator[tuple[BinaryIO, int, bool]]:
    yield f, end, False
    for i in range(1, _MAX_BACKUPS + 1):
        backup = _open_or_none(path.with_name(f"{path.name}.{i}"))
        if backup is None:
            return
        yield backup, os.fstat(backup.fileno()).st_size, True


def _reverse_lines(f: BinaryIO, end: int) -> Iterator[bytes]:
    """Lines of ``f[:end]`` from last to first, reading 64 KiB blocks backwards."""
    pos, carry = end, b""
    while pos > 0:
        step = min(_BLOCK, pos)
        pos -= step
        f.seek(pos)
        chunk = f.read(step) + carry
        parts = chunk.split(b"\n")
        carry = parts[0]
        for raw in reversed(parts[1:]):
            if raw:
                yield raw
        while len(carry) > _MAX_LINE:
            yield carry[-_MAX_LINE:]
            carry = carry[:-_MAX_LINE]
    if carry:
        yield carry


def _end_of_last_line(f: BinaryIO, size: int) -> int:
    """Offset just past the last ``\\n`` before ``size`` (0 when there is none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - _BLOCK)
        f.seek(start)
        i = f.read(pos - start).rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


# --- follow ---------------------------------------------------------------------------

def _follow(f: BinaryIO, path: Path, pos: int, emit, out: TextIO, poll_interval: float,
            stop: threading.Event | None) -> None:
    """Print lines appended from ``pos`` on until ``stop``; closes whichever file it holds."""
    try:
        f.seek(pos)
        ident = _ident(os.fstat(f.fileno()))
        buf = b""
        while stop is None or not stop.is_set():
            data = f.read()
            if data:
                buf = _emit_lines(buf + data, emit)
                out.flush()
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None  # between rename and re-create: keep the old file for now
            if st is not None and _ident(st) != ident:
                # Rotated: print what the writer appended to the old file before the
                # rename (a torn last line included), then read the new file from 0.
                _emit_lines(buf + f.read() + b"\n", emit)
                out.flush()
                f.close()
                new = _open_or_none(path) or _wait_for(path, poll_interval, stop)
                if new is None:
                    return
                f = new
                ident, buf = _ident(os.fstat(f.fileno())), b""
                continue
            if st is not None and st.st_size < f.tell():
                f.seek(0)  # truncated in place (copytruncate)
                buf = b""
                continue
            _pause(poll_interval, stop)
    finally:
        f.close()


def _emit_lines(data: bytes, emit) -> bytes:
    """Emit every complete line of ``data``; return the unfinished tail."""
    parts = data.split(b"\n")
    for raw in parts[:-1]:
        if raw:
            emit(raw)
    return parts[-1]


def _wait_for(path: Path, poll_interval: float, stop: threading.Event | None) -> BinaryIO | None:
    while stop is None or not stop.is_set():
        f = _open_or_none(path)
        if f is not None:
            return f
        _pause(poll_interval, stop)
    return None


def _pause(seconds: float, stop: threading.Event | None) -> None:
    if stop is not None:
        stop.wait(seconds)
    else:
        time.sleep(seconds)


def _open_or_none(path: Path) -> BinaryIO | None:
    try:
        return open(path, "rb")
    except FileNotFoundError:
        return None


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False
