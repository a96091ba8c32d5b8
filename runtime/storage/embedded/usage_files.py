"""Embedded usage ledger: one JSON line per model call, append-only, one file per UTC
month (``<state_dir>/usage/YYYY-MM.jsonl``), mode 0600. Lines are never rewritten; a
torn last line (a crash mid-write) is skipped by readers and the next append starts on a
fresh line. The record's fields: ``runtime.usage.ledger``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runtime.clock import parse_iso, utc_iso


class UsageFiles:
    """The :class:`runtime.storage.usage.UsageRecords` backend: month files under
    ``root`` (created 0700 on first append)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._fh: Any = None
        self._month: str | None = None
        self._span: tuple[float, float, str] = (0.0, 0.0, "")  # the month of ``now``

    def _file(self, month: str) -> Path:
        return self.root / f"{month}.jsonl"

    def append(self, record: dict[str, Any], now: float) -> None:
        """Write one record (``ts`` is set from ``now``, epoch seconds). Raises OSError."""
        start, end, month = self._span
        if not start <= now < end:  # a new UTC month (or the first append)
            at = datetime.fromtimestamp(now, UTC)
            nxt = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
            month = at.strftime("%Y-%m")
            self._span = (datetime(at.year, at.month, 1, tzinfo=UTC).timestamp(),
                          nxt.timestamp(), month)
        if month != self._month:
            self.close()
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = self._file(month)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._fh = os.fdopen(fd, "ab", buffering=0)
            size = os.fstat(fd).st_size
            if size:
                with open(path, "rb") as fh:
                    fh.seek(size - 1)
                    if fh.read(1) != b"\n":  # a torn line: start on a fresh one
                        self._fh.write(b"\n")
            self._month = month
        line = json.dumps({"ts": utc_iso(now), **record}, ensure_ascii=False,
                          separators=(",", ":"))
        self._fh.write(line.encode() + b"\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            self._month = None

    def records(self, since: float | None = None,
                until: float | None = None) -> Iterator[dict[str, Any]]:
        """Records with ``since <= ts < until`` (epoch seconds; None = open), oldest
        first. Reads only the month files that overlap the range."""
        if not self.root.is_dir():
            return
        lo = datetime.fromtimestamp(since, UTC).strftime("%Y-%m") if since else ""
        hi = datetime.fromtimestamp(until, UTC).strftime("%Y-%m") if until else "9999-99"
        for path in sorted(self.root.glob("????-??.jsonl")):
            if not lo <= path.stem <= hi:
                continue
            with open(path, "rb") as fh:
                for raw in fh:
                    rec = _parse(raw)
                    if rec is None:
                        continue
                    ts = rec["_t"]
                    if (since is None or ts >= since) and (until is None or ts < until):
                        yield rec


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(raw)
        rec["_t"] = parse_iso(rec["ts"])
    except (ValueError, KeyError, TypeError):
        return None  # a torn or foreign line
    return rec if isinstance(rec, dict) else None
