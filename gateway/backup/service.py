"""Backups as the gateway and the CLI run them: the destination, the last result
(``<state_dir>/backup-last.json``, read by ``status``, ``doctor`` and ``/metrics``), the
rotation of scheduled backups, and :class:`BackupService`, which fires ``backup.schedule``
(a crontab expression, evaluated by ``scheduler/cron/crontab.py``) on the gateway's clock.

``backup-last.json``::

    {"at": epoch s, "ok": bool, "file": path | null, "bytes": N, "files": N,
     "duration_s": s, "error": text | null, "scheduled": bool, "secrets": bool}
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import structlog

from gateway.backup.archive import (
    NAME_PREFIX,
    SUFFIX,
    BackupError,
    Created,
    create_backup,
    free_path,
)
from runtime.clock import utc_iso
from runtime.fsutil import atomic_write

log = structlog.get_logger(__name__)
LAST_FILE = "backup-last.json"


def backup_dir(config: Any, state_dir: Path) -> Path:
    """``backup.dir`` or ``<state_dir>/backups``."""
    d = config.backup.dir
    return Path(d).expanduser() if d else state_dir / "backups"


def timeline_path(config: Any, state_dir: Path) -> Path | None:
    """The timeline database (``timeline.path`` or ``<state_dir>/timeline.db``)."""
    if not config.timeline.enabled:
        return None
    return Path(config.timeline.path).expanduser() if config.timeline.path \
        else state_dir / "timeline.db"


def run_backup(config: Any, state_dir: Path, *, dest: Path | None = None,
               include_secrets: bool | None = None, scheduled: bool = False,
               now: float | None = None) -> Created:
    """Make one backup of ``state_dir`` (to ``dest``, else a new file in the backup dir),
    record the result in ``backup-last.json`` and, when ``scheduled``, rotate to
    ``backup.keep``. Blocking. Raises BackupError (recorded too)."""
    now = time.time() if now is None else now
    started = time.monotonic()
    secrets = config.backup.include_secrets if include_secrets is None else include_secrets
    folder = backup_dir(config, state_dir)
    record: dict[str, Any] = {"at": now, "scheduled": scheduled, "secrets": secrets}
    try:
        if config.storage.backend != "embedded":
            raise BackupError("storage.backend is postgres: backups of the PostgreSQL "
                              "schema are not supported yet; use pg_dump for the database")
        target = dest if dest is not None else free_path(folder, now)
        made = create_backup(state_dir, target, include_secrets=secrets,
                             timeline_db=timeline_path(config, state_dir), exclude=(folder,),
                             now=now)
    except BackupError as exc:
        record.update(ok=False, error=str(exc), file=None,
                      duration_s=round(time.monotonic() - started, 3))
        write_last(state_dir, record)
        raise
    record.update(ok=True, error=None, file=str(made.path), bytes=made.bytes, files=made.files,
                  duration_s=round(time.monotonic() - started, 3))
    write_last(state_dir, record)
    if scheduled:
        rotate(folder, config.backup.keep)
    return made


def rotate(folder: Path, keep: int) -> list[Path]:
    """Delete the oldest default-named backups in ``folder`` beyond ``keep``; returns the
    deleted files. Files of other names are never touched."""
    mine = sorted(p for p in folder.glob(f"{NAME_PREFIX}*{SUFFIX}") if p.is_file())
    doomed = mine[:-keep] if keep > 0 else mine
    for p in doomed:
        p.unlink(missing_ok=True)
        log.info("backup_rotated", file=str(p))
    return doomed


def write_last(state_dir: Path, record: dict[str, Any]) -> None:
    try:
        atomic_write(state_dir / LAST_FILE, json.dumps(record).encode(), durable=False)
    except OSError as exc:
        log.warning("backup_last_unwritable", path=str(state_dir / LAST_FILE), error=str(exc))


def read_last(state_dir: Path) -> dict[str, Any] | None:
    """The last backup's record, or None (never backed up, or unreadable)."""
    try:
        data = json.loads((state_dir / LAST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def summary(state_dir: Path, now: float, schedule: str | None = None,
            next_at: float | None = None) -> dict[str, Any]:
    """What ``status`` shows: ``{"last_at", "age_s", "ok", "file", "error", "schedule",
    "next_at"}`` (times RFC 3339; None where there is none)."""
    last = read_last(state_dir) or {}
    at = last.get("at")
    return {"last_at": utc_iso(at) if at else None,
            "age_s": round(now - at, 1) if at else None,
            "ok": last.get("ok"), "file": last.get("file"), "error": last.get("error"),
            "schedule": schedule, "next_at": utc_iso(next_at) if next_at else None}


class BackupService:
    """Fires ``backup.schedule`` on the gateway's clock; the backup itself runs in a
    thread (the event loop keeps serving). ``ran`` is set after each run (tests)."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.next_at: float | None = None
        self.ran = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        if self.gw.config.backup.schedule and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        from scheduler.cron import crontab
        clock = self.gw.clock
        while True:
            cfg = self.gw.config.backup
            self.next_at = crontab.next_fire(cfg.schedule, clock.time(), cfg.tz)
            await clock.sleep(self.next_at - clock.time())
            await self.run_once(scheduled=True)

    async def run_once(self, *, scheduled: bool = False) -> Created | None:
        """One backup now (logged; a failure is recorded, not raised)."""
        gw = self.gw
        try:
            made = await asyncio.to_thread(run_backup, gw.config, gw.state_dir,
                                           scheduled=scheduled, now=gw.clock.time())
        except BackupError as exc:
            log.error("backup_failed", error=str(exc))
            made = None
        else:
            log.info("backup_done", file=str(made.path), bytes=made.bytes, files=made.files)
        self.ran.set()
        return made

    def status(self) -> dict[str, Any]:
        return summary(self.gw.state_dir, self.gw.clock.time(),
                       self.gw.config.backup.schedule, self.next_at)

    def problems(self) -> list[str]:
        last = read_last(self.gw.state_dir)
        if last and last.get("ok") is False and last.get("scheduled"):
            return [f"backup: the last scheduled backup failed ({last.get('error')})"]
        return []
