"""Embedded cron store: ``<state_dir>/cron/jobs.json`` and ``cron/runs/<job_id>.jsonl``.

``jobs.json`` is ``{"version": 1, "jobs": [...]}``, one job per line; every write
replaces the file atomically (temp file, fsync, rename, fsync of the directory) under an
``fcntl.flock`` on the sibling ``jobs.json.lock``, so the CLI can edit jobs while the
daemon is down. A file that does not parse is never overwritten: reading and writing
raise :class:`CronStoreError` naming the file until someone fixes or removes it.

The run log ``runs/<job_id>.jsonl`` is append-only, one JSON object per run (fields:
``scheduler.cron.service``).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
from collections import deque
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog

from runtime.storage.cron import CronStoreError

log = structlog.get_logger(__name__)

STORE_VERSION = 1


class CronFiles:
    """The :class:`runtime.storage.cron.CronRecords` backend on files (blocking, small)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.runs_dir = self.path.parent / "runs"
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._held = False
        self._known: tuple[int, int, int] | None = None  # (ino, size, mtime_ns) we wrote/read

    @contextmanager
    def lock(self, exclusive: bool) -> Iterator[None]:
        if self._held:  # re-entrant inside CronStore.transaction()
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            self._held = True
            try:
                yield
            finally:
                self._held = False
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def read(self) -> tuple[list[Any], float | None]:
        try:
            raw = self.path.read_bytes()
            st = self.path.stat()
        except FileNotFoundError:
            return [], None
        except OSError as exc:
            raise CronStoreError(f"{self.path}: cannot read: {exc}") from exc
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CronStoreError(
                f"{self.path}: not valid JSON ({exc}); fix or move the file away - "
                "it will not be overwritten"
            ) from None
        jobs_raw = data.get("jobs") if isinstance(data, dict) else data
        if not isinstance(jobs_raw, list):
            raise CronStoreError(f"{self.path}: expected {{\"jobs\": [...]}}")
        self._known = (st.st_ino, st.st_size, st.st_mtime_ns)
        return jobs_raw, st.st_mtime  # an old file without times: its mtime is the guess

    def write(self, lines: dict[str, str], changed: Collection[str] | None,
              defined_at: dict[str, float]) -> None:
        items = ",\n".join(lines.values())
        body = (f'{{"version": {STORE_VERSION}, "jobs": [\n{items}\n]}}\n').encode()
        with self.lock(exclusive=True):
            self._check_parses()
            fd, tmp = tempfile.mkstemp(prefix=".jobs.", suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
                st = self.path.stat()
                self._known = (st.st_ino, st.st_size, st.st_mtime_ns)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def _check_parses(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        if self._known == (st.st_ino, st.st_size, st.st_mtime_ns):
            return  # the file is what we last read or wrote
        try:
            json.loads(self.path.read_bytes())
            log.warning("cron_store_changed_on_disk", path=str(self.path))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CronStoreError(
                f"{self.path}: refusing to overwrite a file that is not valid JSON ({exc})"
            ) from None

    def run_log_path(self, job_id: str) -> Path:
        """``runs/<job_id>.jsonl`` for a job. Raises ValueError for a malformed id."""
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", job_id):
            raise ValueError(f"invalid job id {job_id!r}")
        return self.runs_dir / f"{job_id}.jsonl"

    def append_run(self, job_id: str, record: dict[str, Any]) -> None:
        """Append one run record as a JSON line (``O_APPEND``, one write, no rewrite)."""
        path = self.run_log_path(job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # a torn last line: start on a fresh one
            os.write(fd, line)
        finally:
            os.close(fd)

    def read_runs(self, job_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """The last ``limit`` run records, oldest first; torn/invalid lines are skipped."""
        path = self.run_log_path(job_id)
        if limit <= 0:
            return []
        want = limit
        while True:
            try:
                lines = _tail_lines(path, want)
            except FileNotFoundError:
                return []
            out: deque[dict[str, Any]] = deque(maxlen=limit)
            bad = 0
            for raw in lines:
                try:
                    rec = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    bad += 1
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
            if len(out) >= limit or len(lines) < want:  # enough, or the whole file
                if bad:
                    log.warning("cron_run_log_bad_lines", job_id=job_id, path=str(path),
                                count=bad)
                return list(out)
            want *= 2

    def run_counts(self) -> dict[str, int]:
        """Run records per job id (for ``storage copy``)."""
        if not self.runs_dir.is_dir():
            return {}
        return {p.stem: len(self.read_runs(p.stem, 10**9))
                for p in sorted(self.runs_dir.glob("*.jsonl"))}


def _tail_lines(path: Path, n: int, block: int = 65536) -> list[bytes]:
    """The last ``n`` non-empty lines of a file, read backwards in blocks (cost ~ n, not size)."""
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        buf, pos = b"", end
        while pos > 0 and buf.count(b"\n") <= n:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            buf = f.read(step) + buf
    lines = [ln for ln in buf.split(b"\n") if ln.strip()]
    if pos > 0:
        lines = lines[1:]  # the first piece may be a partial line
    return lines[-n:]
