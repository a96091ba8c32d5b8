"""Cron job model, ``cron/jobs.json`` persistence and the per-job run log.

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
``error``, ``duration_ms``, ``delivered`` (plus ``due_at`` and ``manual``).
"""

from __future__ import annotations

import copy
import fcntl
import functools
import json
import os
import re
import tempfile
import uuid
from collections import deque
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from runtime.clock import parse_iso, utc_iso
from scheduler import crontab

log = structlog.get_logger(__name__)

__all__ = [
    "DEFAULT_TIMEOUT_ISOLATED",
    "DEFAULT_TIMEOUT_MAIN",
    "RUN_STATUSES",
    "CronJob",
    "CronStore",
    "CronStoreError",
    "job_from_dict",
    "job_to_dict",
    "new_job",
    "parse_at",
    "parse_duration",
    "validate_job",
]

DEFAULT_TIMEOUT_MAIN = 600.0  # seconds; seed 001 §9.4 "普通任务 10 分钟"
DEFAULT_TIMEOUT_ISOLATED = 3600.0  # seconds; seed 001 §9.4 "Agent 回合 60 分钟"
RUN_STATUSES = ("ok", "error", "timeout", "skipped")
STORE_VERSION = 1

_TIME_FIELDS = ("created_at", "updated_at", "next_run_at", "last_run_at", "last_due_at")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)", re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DELIVERY_RE = re.compile(r"^[a-z0-9_.-]+:[^:\s]+(:[^\s]+)?$", re.IGNORECASE)


class CronStoreError(ValueError):
    """``jobs.json`` (or a job in it) is unreadable or invalid; the message names the file."""


@dataclass(slots=True)
class CronJob:
    """One scheduled job (DESIGN.md "Scheduler"; all times epoch seconds).

    ``schedule`` is ``{"kind": "cron", "expr": str, "tz": str | None}``,
    ``{"kind": "every", "interval": seconds, "anchor": epoch | None}`` (runs at
    anchor + k*interval, k >= 0; anchor defaults to ``created_at + interval``) or
    ``{"kind": "at", "at": epoch}``.
    ``session_target`` is ``"main"`` (system event in the main session + heartbeat wake) or
    ``"isolated"`` (own turn in ``agent:<agent>:cron:<id>``); ``payload`` is
    ``{"message": text}``; ``delivery`` is ``"none"``, ``"last"`` or
    ``"<channel>:<to>[:<thread>]"``; ``timeout`` is seconds (0 = no limit).
    The remaining fields are run state kept by :class:`scheduler.cron.CronService`.
    """

    id: str
    name: str
    schedule: dict[str, Any]
    payload: dict[str, Any]
    enabled: bool = True
    session_target: str = "main"
    agent: str = "main"
    delivery: str = "none"
    timeout: float = DEFAULT_TIMEOUT_MAIN
    delete_after_run: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0
    next_run_at: float | None = None
    last_run_at: float | None = None
    last_status: str | None = None
    last_error: str | None = None
    consecutive_errors: int = 0
    last_due_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def copy(self) -> CronJob:
        """An independent copy (callers get copies, never the service's own objects)."""
        return replace(
            self, schedule=dict(self.schedule), payload=copy.deepcopy(self.payload),
            extra=copy.deepcopy(self.extra) if self.extra else {},
        )


def new_job(
    *,
    name: str,
    schedule: dict[str, Any],
    message: str,
    now: float,
    session_target: str = "main",
    agent: str = "main",
    delivery: str | None = None,
    timeout: float | None = None,
    delete_after_run: bool | None = None,
    enabled: bool = True,
) -> CronJob:
    """Build and validate a new job with defaults filled in.

    Defaults: ``timeout`` 600 s for main jobs, 3600 s for isolated agent turns;
    ``delivery`` "none" for main jobs (the heartbeat delivers), "last" for isolated jobs;
    ``delete_after_run`` True for ``at`` schedules. Raises ``ValueError`` on bad input.
    """
    schedule = dict(schedule)
    if schedule.get("kind") == "every" and schedule.get("anchor") is None:
        interval = schedule.get("interval")
        if isinstance(interval, (int, float)) and not isinstance(interval, bool):
            schedule["anchor"] = now + interval
    job = CronJob(
        id=uuid.uuid4().hex[:12],
        name=name,
        schedule=schedule,
        payload={"message": message},
        enabled=enabled,
        session_target=session_target,
        agent=agent,
        delivery=delivery if delivery is not None else
        ("last" if session_target == "isolated" else "none"),
        timeout=timeout if timeout is not None else
        (DEFAULT_TIMEOUT_ISOLATED if session_target == "isolated" else DEFAULT_TIMEOUT_MAIN),
        delete_after_run=(schedule.get("kind") == "at") if delete_after_run is None
        else delete_after_run,
        created_at=now,
        updated_at=now,
    )
    validate_job(job)
    return job


def validate_job(job: CronJob) -> None:
    """Check a job's fields; raises ``ValueError`` naming the field (``schedule.expr: ...``)."""
    if not isinstance(job.id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", job.id):
        raise ValueError(f"id: must be 1-64 letters, digits, '-' or '_', got {job.id!r}")
    if not isinstance(job.name, str):
        raise ValueError("name: must be a string")  # noqa: TRY004 - validation reports ValueError
    s = job.schedule
    kind = s.get("kind") if isinstance(s, dict) else None
    if kind == "cron":
        try:
            crontab.parse(s.get("expr"))
            if s.get("tz") is not None:
                crontab.resolve_tz(s["tz"])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"schedule: {exc}") from None
    elif kind == "every":
        iv = s.get("interval")
        if isinstance(iv, bool) or not isinstance(iv, (int, float)) or iv < 1:
            raise ValueError(f"schedule.interval: must be >= 1 second, got {iv!r}")
        anchor = s.get("anchor")
        if anchor is not None and not isinstance(anchor, (int, float)):
            raise ValueError(f"schedule.anchor: must be epoch seconds, got {anchor!r}")
    elif kind == "at":
        at = s.get("at")
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            raise ValueError(f"schedule.at: must be epoch seconds, got {at!r}")
    else:
        raise ValueError(f"schedule.kind: must be cron, every or at, got {kind!r}")
    if job.session_target not in ("main", "isolated"):
        raise ValueError(f"session_target: must be main or isolated, got {job.session_target!r}")
    msg = job.payload.get("message") if isinstance(job.payload, dict) else None
    if not isinstance(msg, str) or not msg.strip():
        raise ValueError("payload.message: must be a non-empty string")
    if not isinstance(job.agent, str) or not job.agent:
        raise ValueError("agent: must be a non-empty string")
    d = job.delivery
    if not isinstance(d, str) or not (d in ("none", "last") or _DELIVERY_RE.match(d)):
        raise ValueError(f"delivery: must be none, last or <channel>:<to>[:<thread>], got {d!r}")
    t = job.timeout
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
        raise ValueError(f"timeout: must be seconds >= 0, got {t!r}")
    if job.last_status is not None and job.last_status not in RUN_STATUSES:
        raise ValueError(f"last_status: must be one of {RUN_STATUSES}, got {job.last_status!r}")


@functools.lru_cache(maxsize=16384)
def _iso_cached(v: float) -> str:
    return utc_iso(v)  # most times repeat on every save (created_at, anchors, next runs)


def _iso(v: float | None) -> str | None:
    return None if v is None else _iso_cached(v)


def _epoch(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return parse_iso(v)
        except ValueError:
            pass
    raise ValueError(f"{where}: not an RFC 3339 time: {v!r}")


def job_to_dict(job: CronJob) -> dict[str, Any]:
    """JSON form of a job (times as RFC 3339 UTC strings)."""
    sched = dict(job.schedule)
    for k in ("at", "anchor"):
        if isinstance(sched.get(k), (int, float)):
            sched[k] = _iso_cached(sched[k])
    out: dict[str, Any] = dict(job.extra)
    out.update(
        id=job.id, name=job.name, enabled=job.enabled, schedule=sched,
        session_target=job.session_target, payload=dict(job.payload), agent=job.agent,
        delivery=job.delivery, timeout=job.timeout, delete_after_run=job.delete_after_run,
        consecutive_errors=job.consecutive_errors, last_status=job.last_status,
        last_error=job.last_error,
    )
    for name in _TIME_FIELDS:
        out[name] = _iso(getattr(job, name))
    return out


def job_from_dict(data: dict[str, Any]) -> CronJob:
    """Parse one job object from ``jobs.json``; missing optional fields get defaults.

    Required: ``id``, ``schedule``, ``payload.message``. Raises ``ValueError`` naming the
    field.
    """
    if not isinstance(data, dict):
        raise TypeError("job must be a JSON object")
    if "id" not in data or "schedule" not in data:
        raise ValueError("id and schedule are required")
    sched = dict(data["schedule"]) if isinstance(data["schedule"], dict) else data["schedule"]
    if isinstance(sched, dict):
        for k in ("at", "anchor"):
            if k in sched:
                sched[k] = _epoch(sched[k], f"schedule.{k}")
    target = data.get("session_target", "main")
    timeout = data.get("timeout")
    if timeout is None:
        timeout = DEFAULT_TIMEOUT_ISOLATED if target == "isolated" else DEFAULT_TIMEOUT_MAIN
    known = {"id", "name", "enabled", "schedule", "session_target", "payload", "agent",
             "delivery", "timeout", "delete_after_run", "consecutive_errors", "last_status",
             "last_error", *_TIME_FIELDS}
    for flag in ("enabled", "delete_after_run"):
        if flag in data and not isinstance(data[flag], bool):
            raise ValueError(f"{flag}: must be true or false, got {data[flag]!r}")
    job = CronJob(
        id=data["id"],
        name=data.get("name") or "",
        schedule=sched,
        payload=data.get("payload") or {},
        enabled=bool(data.get("enabled", True)),
        session_target=target,
        agent=data.get("agent") or "main",
        delivery=data.get("delivery") or "none",
        timeout=timeout,
        delete_after_run=bool(data.get("delete_after_run",
                                       isinstance(sched, dict) and sched.get("kind") == "at")),
        consecutive_errors=int(data.get("consecutive_errors") or 0),
        last_status=data.get("last_status"),
        last_error=data.get("last_error"),
        extra={k: v for k, v in data.items() if k not in known},
    )
    for name in _TIME_FIELDS:
        setattr(job, name, _epoch(data.get(name), name))
    job.created_at = job.created_at or 0.0
    job.updated_at = job.updated_at or job.created_at
    validate_job(job)
    return job


def parse_duration(text: str | float) -> float:
    """Seconds from ``"30s"``, ``"20m"``, ``"2h"``, ``"1d"``, ``"1w"``, ``"1h30m"``, ``"500ms"``
    or a bare number of seconds. Raises ``ValueError`` on anything else or a negative value.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"duration must not be negative: {text!r}")
        return float(text)
    if not isinstance(text, str):
        raise TypeError(f"invalid duration {text!r}")
    s = text.strip().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2).lower()]
        pos = m.end()
    if not s or pos != len(s):
        raise ValueError(f"invalid duration {text!r} (examples: 30s, 20m, 2h, 1d, 1h30m)")
    return total


def parse_at(text: str, now: float) -> float:
    """Epoch seconds for an ``at`` schedule: RFC 3339 (``2026-03-01T09:00:00+01:00``; no
    offset = UTC) or relative to ``now`` (``"20m"``, ``"2h"``, ``"1d"``, ``"30s"``, also
    with a leading ``+``). Raises ``ValueError`` on anything else.
    """
    s = text.strip()
    rel = s.removeprefix("+")
    if rel and rel[0].isdigit() and not re.match(r"\d{4}-", rel):
        return now + parse_duration(rel)
    try:
        return parse_iso(s)
    except ValueError:
        raise ValueError(
            f"invalid time {text!r}: use RFC 3339 (2026-03-01T09:00:00Z) or 20m / 2h / 1d"
        ) from None


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
