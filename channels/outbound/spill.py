"""The outbox's spill: writes a remote outbox store (PostgreSQL) refuses, mirrored on local
disk while it refuses them (issue 15 "nothing accepted is lost": a stop or a kill -9
during the outage keeps them), re-submitted by the running outbox as soon as the store
takes writes again and by the next start; the file goes once the store has them all.

File format and atomic replace: ``runtime.storage.embedded.outbox_spill``
(``<state_dir>/outbox/pending-spill.jsonl``, each line with ``since``: when that write
was first refused, epoch s). ``status``/``problems`` feed ``tidegate status`` and the
control API; ``tidegate doctor`` reads the file itself (:func:`spill_summary`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from runtime.clock import Clock, parse_iso
from runtime.state_files import report_corrupt
from runtime.storage.embedded.outbox_spill import (
    encode_spill,
    read_spill,
    set_aside,
    spill_path,
    write_spill,
)

log = structlog.get_logger(__name__)


class Spill:
    """The spill file of the outbox directory ``dir``. ``writes`` handed to :meth:`keep`
    are the outbox's pending ``{id: (op, OutboxEntry)}``."""

    def __init__(self, dir: Path, clock: Clock, *, store: str,
                 problems: list[str] | None = None) -> None:
        self.path = spill_path(dir)
        self._clock, self._store, self._problems = clock, store, problems
        self.since: dict[str, float] = {}  # entry id -> first refused (epoch s)
        self._kept: bytes | None = None  # what the file holds now (None: no file)
        self.restored = 0  # writes a previous run left, not yet in the store

    def restore(self, parse: Callable[[dict[str, Any]], Any]) -> list[tuple[str, Any]]:
        """The (op, ``parse(entry json)``) pairs a previous run left; [] when none or
        unreadable (an unreadable file is set aside and reported: only it is disabled)."""
        try:
            lines = [(op, parse(entry), since) for op, entry, since in read_spill(self.path)]
            self._kept = self.path.read_bytes() if lines else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            try:
                kept = set_aside(self.path)
            except OSError:
                kept = self.path
            report_corrupt("outbox", self.path, f"{type(e).__name__}: {e}",
                           problems=self._problems,
                           effect=f"the replies it held are not re-sent; kept as {kept}",
                           fix=f"read {kept}, send what matters by hand, then delete it")
            return []
        now = self._clock.time()
        for _, entry, since in lines:
            self.since[str(entry.id)] = since if since is not None else now
        self.restored = len(lines)
        return [(op, entry) for op, entry, _ in lines]

    def keep(self, writes: dict[str, tuple[str, Any]]) -> None:
        """Mirror ``writes`` (the store refused them) in the file, if they changed."""
        now = self._clock.time()
        for entry_id in writes:
            self.since.setdefault(entry_id, now)
        rows = [(op, e.to_json(), self.since[i]) for i, (op, e) in writes.items()]
        if encode_spill(rows) == self._kept:
            return
        try:
            self._kept = write_spill(self.path, rows)
        except OSError as exc:
            log.error("outbox_spill_failed", path=str(self.path), error=str(exc))
            return
        log.warning("outbox_spilled", count=len(rows), path=str(self.path), store=self._store)

    def clear(self) -> None:
        """The store holds every write: remove the file (if any)."""
        self.since.clear()
        if self._kept is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.error("outbox_spill_remove_failed", path=str(self.path), error=str(exc))
            return
        count = self._kept.count(b"\n")
        self._kept, self.restored = None, 0
        log.info("outbox_spill_restored", count=count, path=str(self.path), store=self._store)

    def status(self) -> dict[str, Any] | None:
        """``{"count", "oldest_age_s", "path"}`` while the file holds writes, else None."""
        if self._kept is None:
            return None
        count = self._kept.count(b"\n")
        oldest = min(self.since.values(), default=self._clock.time())
        return {"count": count, "oldest_age_s": round(self._clock.time() - oldest, 1),
                "path": str(self.path)}

    def problems(self) -> list[str]:
        st = self.status()
        if st is None:
            return []
        return [(f"outbox: {st['count']} writes PostgreSQL refused wait in {st['path']} "
                 f"(oldest {st['oldest_age_s']:.0f} s); this gateway re-submits them once "
                 "PostgreSQL takes writes again (do not delete the file)")]


def spill_summary(dir: Path, now: float) -> tuple[int, float] | None:
    """(writes waiting, age in s of the oldest) in the spill file of outbox ``dir``; None
    when there is none. Raises OSError or ValueError (an unreadable file)."""
    lines = read_spill(spill_path(dir))
    if not lines:
        return None
    stamps = [since if since is not None else parse_iso(entry["created_at"])
              for _, entry, since in lines]
    return len(lines), max(0.0, now - min(stamps))
