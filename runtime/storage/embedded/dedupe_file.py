"""Embedded inbound dedupe ledger: ``<state_dir>/channels/inbound-seen.jsonl``.

Append-only, one JSON line per key: ``[epoch_seconds, "key"]``. On load, expired entries
(older than the TTL) and torn lines are dropped and the file is rewritten atomically; it
is compacted the same way when the service asks (it grew past twice its entry cap).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import structlog

from runtime.fsutil import atomic_write
from runtime.state_files import keep_aside, report_corrupt

log = structlog.get_logger(__name__)


class DedupeFile:
    """The :class:`runtime.storage.dedupe.DedupeRecords` backend on one file. One process
    owns it. Raises OSError when it cannot be opened, copied aside or written."""

    def __init__(self, path: Path, problems: list[str] | None = None) -> None:
        self.path = Path(path)
        self._problems = problems
        self._fd: int | None = None

    def load(self, now: float, ttl: float) -> dict[str, float]:
        """A torn last line (a crash mid-append) is a routine repair
        (``dedupe_lines_skipped``); bad lines elsewhere mean the file is corrupt: its
        bytes are copied aside first and it is reported (``runtime.state_files``);
        detection goes on with the readable entries."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raw = b""
        lines = raw.splitlines()
        seen: dict[str, float] = {}
        bad = []
        for i, line in enumerate(lines):
            try:
                ts, key = json.loads(line)
                ts = float(ts)
            except (ValueError, TypeError):
                bad.append(i)
                continue
            if now - ts < ttl:
                seen.pop(key, None)
                seen[key] = ts
        torn_tail = bad == [len(lines) - 1] and not raw.endswith(b"\n")
        if bad and not torn_tail:
            self._corrupt(len(bad), len(lines))
        if torn_tail:
            log.warning("dedupe_lines_skipped", path=str(self.path), count=1)
        return seen

    def _corrupt(self, bad: int, total: int) -> None:
        copy = keep_aside(self.path)
        if copy is None:
            raise OSError(f"{self.path}: corrupt and could not be copied aside")
        report_corrupt("inbound dedupe ledger", self.path, f"{bad} of {total} lines invalid",
                       problems=self._problems,
                       effect=f"duplicate detection goes on with the {total - bad} readable "
                              f"entries (a redelivered message may run twice); the old file "
                              f"is kept as {copy.name}",
                       fix=f"nothing to do; delete {copy.name} once inspected")

    def compact(self, seen: dict[str, float], now: float, ttl: float) -> None:
        """The live keys only, written atomically; reopen for appending."""
        data = "".join(json.dumps([ts, k], ensure_ascii=False) + "\n"
                       for k, ts in seen.items()).encode()
        self.close()
        atomic_write(self.path, data)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def add(self, key: str, now: float, ttl: float) -> bool:
        """One small ``write`` (the service already knows the key is new here)."""
        assert self._fd is not None, "load and compact first"
        os.write(self._fd, (json.dumps([now, key], ensure_ascii=False) + "\n").encode())
        return True

    def count(self, now: float, ttl: float) -> int:
        """Live keys (for ``storage copy``), read without changing the file."""
        return len(self.load(now, ttl)) if self.path.exists() else 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
