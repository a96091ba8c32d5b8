"""Reading ``logs/gateway.jsonl``: ``tidegate logs [-f] [--level L] [--session KEY] [--json]``.

The tail is read backwards from the end of the file in 64 KiB blocks (a 1 GB log costs
what its last few hundred lines cost) and continues into the rotated ``gateway.jsonl.1``,
``.2``... only when the current file holds fewer matching lines than asked for. Follow
mode polls the open file for appended bytes and notices rotation (the path now names a
different inode: the old file is drained first, then the new one read from its start) and
truncation (size below our offset: read again from 0). A line that is not a JSON object
(torn write, foreign text) is printed raw, whatever the filters — it is a sign of trouble
worth seeing.

Readable rendering: ``HH:MM:SS.mmm LEVEL   event key=value ...`` in local time, context keys
(session_key, run_id, channel, agent, job_id) first, tracebacks on the following lines;
colour only when the output is a TTY.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, TextIO

from runtime.clock import parse_iso

LEVEL_RANK = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40,
              "exception": 40, "critical": 50}
_BLOCK = 64 * 1024
# Longest line kept whole when reading backwards; longer runs without a newline (NUL blocks
# a crash can leave behind) come out in pieces so memory stays bounded.
_MAX_LINE = 1024 * 1024
_MAX_BACKUPS = 100  # gateway.jsonl.1 .. .N; stop at the first missing one anyway
_OMIT = frozenset({"ts", "level", "event", "logger", "exception", "stack", "stack_info"})

_RESET, _DIM, _BOLD, _CYAN = "\x1b[0m", "\x1b[2m", "\x1b[1m", "\x1b[36m"
_LEVEL_STYLE = {"debug": _DIM, "info": "\x1b[32m", "warning": "\x1b[33m",
                "error": "\x1b[31;1m", "critical": "\x1b[41;1m"}


@dataclass(frozen=True)
class LogFilter:
    """Which lines to show: ``min_level`` rank (0 = all); a session key, an event name and a
    channel, each exact or a prefix (compared lower-case: ``turn_`` matches ``turn_start``,
    ``telegram`` matches ``telegram:work``). Lines that are not JSON objects always pass."""

    min_level: int = 0
    session: str | None = None
    since: float | None = None
    until: float | None = None
    event: str | None = None
    channel: str | None = None

    @classmethod
    def build(cls, level: str | None, session: str | None, since: float | None = None,
              until: float | None = None, *, event: str | None = None,
              channel: str | None = None) -> LogFilter:
        """Raises ValueError for an unknown level name. ``since``/``until``: epoch seconds
        (a line's ``ts`` must be >= since and < until)."""
        rank = 0
        if level:
            rank = LEVEL_RANK.get(level.lower(), -1)
            if rank < 0:
                raise ValueError(f"--level: must be one of debug, info, warning, error, "
                                 f"critical (got {level!r})")
        low = lambda v: v.strip().lower() if v and v.strip() else None
        return cls(rank, low(session), since, until, low(event), low(channel))

    def matches(self, record: dict | None) -> bool:
        if record is None:
            return self.since is None and self.until is None
        if self.since is not None or self.until is not None:
            try:
                ts = parse_iso(str(record.get("ts")))
            except ValueError:
                return False
            if (self.since is not None and ts < self.since) or \
                    (self.until is not None and ts >= self.until):
                return False
        if self.min_level:
            lvl = record.get("level")
            if LEVEL_RANK.get(str(lvl).lower(), 0) < self.min_level:
                return False
        for want, field_name in ((self.session, "session_key"), (self.event, "event"),
                                 (self.channel, "channel")):
            if want is not None:
                got = record.get(field_name)
                if not isinstance(got, str) or not got.lower().startswith(want):
                    return False
        return True


def parse_line(line: str) -> dict | None:
    """One log line -> its JSON object, or None when it is not a JSON object."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def format_record(record: dict, *, color: bool = False, utc: bool = False) -> str:
    """Render one parsed log line as ``YYYY-MM-DD HH:MM:SS.mmm ZONE LEVEL   event
    key=value ...`` (local time and its zone abbreviation, or UTC with ``utc``); an
    ``exception`` / ``stack`` text follows on the next lines."""
    stamp = _stamp(record.get("ts"), utc)
    level = str(record.get("level", "?")).lower()
    event = record.get("event", "")
    event = event if isinstance(event, str) else json.dumps(event, ensure_ascii=False)
    from gateway.logs.pipeline import CONTEXT_KEYS  # structlog: not on `agent -m`'s path
    keys = [k for k in CONTEXT_KEYS if k in record]
    keys += [k for k in record if k not in _OMIT and k not in CONTEXT_KEYS]
    pairs = [(k, _value(record[k])) for k in keys]
    logger = record.get("logger")
    if color:
        style = _LEVEL_STYLE.get(level, "")
        parts = [f"{_DIM}{stamp}{_RESET}", f"{style}{level.upper():<7}{_RESET}",
                 f"{_BOLD}{event}{_RESET}"]
        parts += [f"{_CYAN}{k}{_RESET}={v}" for k, v in pairs]
        if logger:
            parts.append(f"{_DIM}[{logger}]{_RESET}")
    else:
        parts = [stamp, f"{level.upper():<7}", event]
        parts += [f"{k}={v}" for k, v in pairs]
        if logger:
            parts.append(f"[{logger}]")
    text = " ".join(parts)
    for extra in ("stack", "stack_info", "exception"):
        block = record.get(extra)
        if isinstance(block, str) and block:
            text += "\n" + "\n".join("    " + ln for ln in block.rstrip("\n").splitlines())
    return text


def nonneg_int(text: str) -> int:
    """argparse ``type`` for ``tidegate logs -n``: a whole number >= 0.

    Raises argparse.ArgumentTypeError, which argparse prints as a usage error (exit 2).
    """
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


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
    color = not as_json and _isatty(out)
    printed = 0

    def emit(raw: bytes) -> None:
        nonlocal printed
        text = raw.decode("utf-8", "replace").rstrip("\r")
        record = parse_line(text)
        if record is None:
            text = text.replace("\x00", "")  # NUL runs: what a crash leaves, not content
        if not text.strip() or not filt.matches(record):
            return
        out.write((text if as_json or record is None else format_record(record, color=color,
                                                                        utc=utc))
                  + "\n")
        printed += 1

    f = _open_or_none(path)
    if f is None:
        if not follow:
            raise FileNotFoundError(f"no log file at {path}")
        f = _wait_for(path, poll_interval, stop)
        if f is None:
            return 0
        pos = 0
    else:
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
    out.flush()
    if follow:
        _follow(f, path, pos, emit, out, poll_interval, stop)  # closes f
    else:
        f.close()
    return printed


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


# --- rendering helpers ----------------------------------------------------------------

def _stamp(ts: object, utc: bool) -> str:
    bad = "????-??-?? ??:??:??.??? ???"
    if not isinstance(ts, str):
        return bad
    try:
        epoch = parse_iso(ts)
        dt = datetime.fromtimestamp(epoch, UTC) if utc else \
            datetime.fromtimestamp(epoch).astimezone()
    except (ValueError, OverflowError, OSError):
        return bad
    return (dt.strftime("%Y-%m-%d %H:%M:%S") + f".{dt.microsecond // 1000:03d} "
            + ("UTC" if utc else dt.strftime("%Z")))


def parse_when(text: str, now: float) -> float:
    """``--since``/``--until``: a duration back from ``now`` (``10m``, ``2h``, ``7d``), an
    RFC 3339 time, or a local date/time (``2026-01-31``, ``2026-01-31 14:00``). Returns
    epoch seconds. Raises argparse.ArgumentTypeError."""
    from runtime.config_types import parse_duration
    text = text.strip()
    try:
        return now - parse_duration(text)
    except (ValueError, TypeError):
        pass
    try:
        return parse_iso(text)
    except ValueError:
        pass
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return datetime.strptime(text, fmt).astimezone().timestamp()
        except ValueError:
            continue
    raise argparse.ArgumentTypeError(
        f"expected a duration (10m, 2h, 7d), an RFC 3339 time or a local date "
        f"(YYYY-MM-DD[ HH:MM]), got {text!r}")


def _value(v: object) -> str:
    if isinstance(v, str):
        if v and not any(c in v for c in " \t\n\r=\"'"):
            return v
        return json.dumps(v, ensure_ascii=False)
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"), default=str)


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False
