"""Log records as ``tidegate logs`` and the control UI's logs view read them: one JSON
object per line of ``logs/gateway.jsonl``, the filters (level, session key, event,
channel, time bounds) and the readable rendering: ``HH:MM:SS.mmm LEVEL   event key=value
...`` in local time, context keys (session_key, run_id, channel, agent, job_id) first,
tracebacks on the following lines; colour only when the output is a TTY. Reading the file
(tail, follow, rotation): gateway/logs/reader.py.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from runtime.clock import parse_iso

LEVEL_RANK = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40,
              "exception": 40, "critical": 50}
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
