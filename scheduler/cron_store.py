"""``cron/jobs.json`` persistence and the per-job run log (the job model is in
``scheduler.cron_job``).

DESIGN.md "Files on disk" / "Scheduler", seed 001 §9.4. ``jobs.json`` is
``{"version": 1, "jobs": [...]}``; every write replaces the file atomically (temp file,
fsync, rename, fsync of the directory) under an ``fcntl.flock`` on the sibling
``jobs.json.lock``, so the CLI can edit jobs while the daemon is down (or tell the running
daemon to ``reload``). A file that does not parse is never overwritten: loading and saving
raise :class:`CronStoreError` naming the file until someone fixes or removes it.

Times are epoch seconds in memory and RFC 3339 UTC strings (``utc_iso``) in JSON,
including ``schedule.at`` and ``schedule.anchor``. Unknown job keys are kept in
``CronJob.extra`` and written back unchanged.

The run log ``cron/runs/<job_id>.jsonl`` is append-only, one JSON object per run:
``started_at``, ``finished_at`` (RFC 3339), ``status`` (ok | error | timeout | skipped),
``error``, ``duration_ms``, ``delivered`` (plus ``due_at``, ``manual`` and, for isolated
runs, the ``session_id`` the run's turn used).
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

from scheduler.cron_job import CronJob, job_from_dict, job_to_dict, validate_job

log = structlog.get_logger(__name__)

STORE_VERSION = 1


class CronStoreError(ValueError):
    """``jobs.json`` (or a job in it) is unreadable or invalid; the message names the file."""




class CronStore:
    """``<state_dir>/cron/jobs.json`` plus ``<state_dir>/cron/runs/<job_id>.jsonl``.

    All methods are blocking file I/O (small, fast); ``load``/``save`` take the lock
    themselves, :meth:`transaction` holds it across a load-modify-save (for the CLI).
    Raises :class:`CronStoreError` for an unreadable or invalid ``jobs.json``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.runs_dir = self.path.parent / "runs"
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._held = False
        self._known: tuple[int, int, int] | None = None  # (ino, size, mtime_ns) we wrote/read
        self._lines: dict[str, str] = {}  # job id -> its JSON line in the last save

    @contextmanager
    def _lock(self, exclusive: bool) -> Iterator[None]:
        if self._held:  # re-entrant inside transaction()
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

    def _read(self) -> list[CronJob]:
        try:
            raw = self.path.read_bytes()
            st = self.path.stat()
        except FileNotFoundError:
            return []
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
        jobs, seen = [], set()
        for i, item in enumerate(jobs_raw):
            ident = item.get("id") if isinstance(item, dict) else None
            try:
                job = job_from_dict(item)
            except (ValueError, TypeError) as exc:
                raise CronStoreError(f"{self.path}: jobs[{i}] (id {ident!r}): {exc}") from None
            if not job.created_at:  # an old file without times: its mtime is the best guess
                job.created_at = st.st_mtime
                job.updated_at = job.updated_at or job.created_at
            if job.id in seen:
                raise CronStoreError(f"{self.path}: jobs[{i}]: duplicate id {job.id!r}")
            seen.add(job.id)
            jobs.append(job)
        self._known = (st.st_ino, st.st_size, st.st_mtime_ns)
        self._lines = {}  # new objects: encode them afresh on the next save
        return jobs

    def load(self) -> list[CronJob]:
        """All jobs in file order (``[]`` when the file does not exist yet)."""
        with self._lock(exclusive=False):
            return self._read()

    def save(self, jobs: list[CronJob], changed: Collection[str] | None = None) -> None:
        """Atomically replace ``jobs.json`` with ``jobs``.

        ``changed`` (an optimisation for large stores) names the job ids modified since this
        store's previous ``save``; the others reuse their previously encoded line. None
        (default) re-encodes everything. Raises ``CronStoreError`` (and writes nothing) for
        duplicate ids or an invalid job, and when the file on disk exists but does not
        parse, so a hand-broken file is never silently replaced.
        """
        lines: dict[str, str] = {}
        for j in jobs:
            if j.id in lines:
                raise CronStoreError(f"{self.path}: duplicate job id {j.id!r}; nothing written")
            line = None if changed is None or j.id in changed else self._lines.get(j.id)
            if line is None:
                try:
                    validate_job(j)
                except ValueError as exc:
                    raise CronStoreError(f"{self.path}: job {j.id!r}: {exc}; nothing written") \
                        from None
                # One job per line: readable, diffable, and the fast C encoder.
                line = json.dumps(job_to_dict(j), ensure_ascii=False)
            lines[j.id] = line
        items = ",\n".join(lines.values())
        body = (f'{{"version": {STORE_VERSION}, "jobs": [\n{items}\n]}}\n').encode()
        with self._lock(exclusive=True):
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
                self._lines = lines
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

    @contextmanager
    def transaction(self) -> Iterator[list[CronJob]]:
        """Exclusive lock held across load and save: ``with store.transaction() as jobs:``
        mutate the list in place; it is saved when the block exits without an exception.
        """
        with self._lock(exclusive=True):
            jobs = self._read()
            yield jobs
            self.save(jobs)

    def run_log_path(self, job_id: str) -> Path:
        """``runs/<job_id>.jsonl`` for a job."""
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
