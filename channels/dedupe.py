"""Exactly-once intake of inbound messages across restarts.

Platforms redeliver: Slack retries an event it thinks we missed (same ``event_id``,
``retry_attempt`` > 0), Telegram re-sends updates whose offset was not confirmed before a
crash, Discord replays on RESUME. The gateway calls ``check_and_mark(dedupe_key(msg))``
before running a message and drops it when the key was seen within the TTL.

The file is append-only, one JSON line per key: ``[epoch_seconds, "key"]``. On load, expired
entries (older than ``ttl``) and torn lines are dropped, and the file is rewritten atomically;
it is compacted the same way when it grows past twice ``max_entries`` lines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import structlog

from channels.base import InboundMessage
from runtime.clock import Clock
from runtime.fsutil import atomic_write
from runtime.state_files import keep_aside, report_corrupt

log = structlog.get_logger(__name__)

DEFAULT_TTL = 7 * 86400.0  # seconds


def dedupe_key(msg: InboundMessage) -> str | None:
    """``channel:account:(group_id or peer_id):message_id``, or None when the message has no
    id (such messages are not deduplicated)."""
    if not msg.message_id:
        return None
    where = msg.group_id or msg.peer_id
    return f"{msg.channel.lower()}:{msg.account_id}:{where}:{msg.message_id}"


class InboundDedupe:
    """Seen-keys set backed by an append-only file at ``path``.

    ``ttl`` is seconds; ``max_entries`` bounds memory (the oldest keys go first). One
    process owns the file. Raises OSError when the file cannot be opened or written.
    """

    def __init__(self, path: Path, clock: Clock, ttl: float = DEFAULT_TTL,
                 max_entries: int = 100_000, problems: list[str] | None = None) -> None:
        if ttl <= 0 or max_entries < 1:
            raise ValueError("ttl must be > 0 and max_entries >= 1")
        self.path = Path(path)
        self._clock = clock
        self.ttl = float(ttl)
        self.max_entries = max_entries
        self._seen: dict[str, float] = {}  # insertion order ~ time order
        self._lines = 0
        self._fd: int | None = None
        self._problems = problems
        self._load()

    def _load(self) -> None:
        """Read the ledger and compact it. A torn last line (a crash mid-append) is a
        routine repair (``dedupe_lines_skipped``); bad lines elsewhere mean the file is
        corrupt: its bytes are copied aside first and it is reported
        (``runtime.state_files``); detection goes on with the readable entries. Raises
        OSError when the file cannot be read or copied (the gateway then runs without
        de-duplication)."""
        now = self._clock.time()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raw = b""
        lines = raw.splitlines()
        bad = []
        for i, line in enumerate(lines):
            try:
                ts, key = json.loads(line)
                ts = float(ts)
            except (ValueError, TypeError):
                bad.append(i)
                continue
            if now - ts < self.ttl:
                self._seen.pop(key, None)
                self._seen[key] = ts
        torn_tail = bad == [len(lines) - 1] and not raw.endswith(b"\n")
        if bad and not torn_tail:
            self._corrupt(len(bad), len(lines))
        self._trim()
        self._rewrite()
        if torn_tail:
            log.warning("dedupe_lines_skipped", path=str(self.path), count=1)

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

    def _rewrite(self) -> None:
        """Compact: the live keys only, written atomically; reopen for appending."""
        data = "".join(json.dumps([ts, k], ensure_ascii=False) + "\n"
                       for k, ts in self._seen.items()).encode()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        atomic_write(self.path, data)
        self._lines = len(self._seen)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _trim(self) -> None:
        while len(self._seen) > self.max_entries:
            self._seen.pop(next(iter(self._seen)))

    def _expire(self, now: float) -> None:
        for key, ts in self._seen.items():
            if now - ts < self.ttl:
                return
            del self._seen[key]
            break  # dict changed size: one per call keeps each call O(1) amortised

    def seen(self, key: str) -> bool:
        """True if ``key`` was marked within the TTL (nothing is written)."""
        ts = self._seen.get(key)
        return ts is not None and self._clock.time() - ts < self.ttl

    def check_and_mark(self, key: str) -> bool:
        """True if ``key`` is new (and now marked seen), False if seen within the TTL.

        Cost: a dict lookup plus one small ``write`` to the file for new keys."""
        now = self._clock.time()
        self._expire(now)
        self._expire(now)
        ts = self._seen.get(key)
        if ts is not None and now - ts < self.ttl:
            return False
        self._seen.pop(key, None)
        self._seen[key] = now
        self._trim()
        assert self._fd is not None
        os.write(self._fd, (json.dumps([now, key], ensure_ascii=False) + "\n").encode())
        self._lines += 1
        if self._lines > 2 * self.max_entries:
            self._rewrite()
        return True

    def __len__(self) -> int:
        return len(self._seen)

    def close(self) -> None:
        """Close the append handle (the file stays valid: every line is complete)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_dedupe(path: Path, clock: Clock, problems: list[str] | None = None
                ) -> InboundDedupe | None:
    """The gateway's ledger, or None (reported) when its file cannot be used at all: only
    duplicate detection is lost, every channel still runs."""
    try:
        return InboundDedupe(path, clock, problems=problems)
    except OSError as exc:
        report_corrupt("inbound dedupe ledger", path, f"{type(exc).__name__}: {exc}",
                       problems=problems,
                       effect="duplicate detection is off (a redelivered message may run "
                              "twice); the file is not touched",
                       fix=f"move {path} away (it is recreated) and restart the gateway")
        return None
