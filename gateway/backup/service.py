"""Backups as the gateway and the CLI run them: the destination, the last result
(``<state_dir>/backup-last.json``, read by ``status``, ``doctor`` and ``/metrics``), the
rotation of scheduled backups, and :class:`BackupService`, which fires ``backup.schedule``
(a crontab expression, evaluated by ``scheduler/cron/crontab.py``) on the gateway's clock.

``backup-last.json``::

    {"at": epoch s, "ok": bool, "file": path | null, "bytes": N, "files": N,
     "duration_s": s, "error": text | null, "scheduled": bool, "secrets": bool,
     "cut_hold_ms": ms | null (made by the running gateway: how long its writers waited)}
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

import structlog

from gateway.backup.archive import (
    BackupError,
    BackupRefused,
    Created,
    check_state_dir,
    create_backup,
)
from gateway.backup.names import NAME_PREFIX, SCHEDULED_NAME, SUFFIX, free_path
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
               now: float | None = None, overwrite: bool = False,
               cut: Any = None) -> Created:
    """Make one backup of ``state_dir`` (to ``dest``, else a new file in the backup dir;
    ``overwrite``: an existing regular file at ``dest`` may be replaced; ``cut``: the
    running gateway's, see ``create_backup``), record the
    result in ``backup-last.json`` and, when ``scheduled``, rotate to ``backup.keep``.
    Blocking. Raises BackupError (recorded too, except for a missing state dir and for
    BackupRefused, a ``dest`` that exists or lies inside the state dir: nothing is
    attempted then)."""
    now = time.time() if now is None else now
    check_state_dir(state_dir)
    started = time.monotonic()
    secrets = config.backup.include_secrets if include_secrets is None else include_secrets
    folder = backup_dir(config, state_dir)
    record: dict[str, Any] = {"at": now, "scheduled": scheduled, "secrets": secrets}
    try:
        target = dest if dest is not None else free_path(folder, now, scheduled=scheduled)
        pg = config.storage.dsn if config.storage.backend == "postgres" else None
        made = create_backup(state_dir, target, include_secrets=secrets,
                             timeline_db=timeline_path(config, state_dir), exclude=(folder,),
                             now=now, postgres_dsn=pg, overwrite=overwrite, cut=cut,
                             unique=dest is None,  # two at once: -1, -2 ..., no clash
                             scheduled=scheduled)
    except BackupRefused:
        if dest is None:  # a default name another backup took since free_path: next one
            return run_backup(config, state_dir, include_secrets=include_secrets,
                              scheduled=scheduled, now=now, cut=cut)
        raise  # a usage error before any copying: no backup was attempted, none recorded
    except Exception as exc:  # noqa: BLE001 - every failure is a recorded failed backup
        error = _reason(exc, folder)
        record.update(ok=False, error=error, file=None,
                      duration_s=round(time.monotonic() - started, 3))
        write_last(state_dir, record)
        raise BackupError(error) from None
    record.update(ok=True, error=None, file=str(made.path), bytes=made.bytes, files=made.files,
                  duration_s=round(time.monotonic() - started, 3),
                  cut_hold_ms=(made.cut or {}).get("hold_ms"))
    write_last(state_dir, record)
    if scheduled:
        rotate(folder, config.backup.keep, state_dir)
    return made


def _reason(exc: Exception, folder: Path) -> str:
    """The sentence recorded for a failed backup."""
    if isinstance(exc, BackupError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{exc.filename or folder}: {exc.strerror or exc}"
    return f"{type(exc).__name__}: {exc}"


def rotate(folder: Path, keep: int, state_dir: Path | None = None) -> list[Path]:
    """Delete the oldest scheduled backups in ``folder`` beyond ``keep``; returns the
    deleted files. Files of other names (hand-made backups: ``...-manual.tar.gz``, any
    ``--to`` name) are never touched, nor a ``--to`` archive given a scheduled-looking
    name (its manifest says ``"scheduled": false``); with ``state_dir``, neither are
    backups whose manifest names another state dir (gateways sharing one ``backup.dir``)
    or cannot be read (kept rather than deleted unrecognised)."""
    mine = sorted(p for p in folder.glob(f"{NAME_PREFIX}*{SUFFIX}")
                  if p.is_file() and SCHEDULED_NAME.fullmatch(p.name))
    mine = [p for p in mine if _scheduled(p, state_dir)]
    doomed = mine[:-keep] if keep > 0 else mine
    for p in doomed:
        try:
            p.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("backup_rotate_failed", file=str(p), error=str(exc))
            continue
        log.info("backup_rotated", file=str(p))
    return doomed


def _scheduled(archive: Path, state_dir: Path | None) -> bool:
    """True when ``archive`` is one rotation may delete: its manifest does not say it was
    made by hand (``"scheduled": false``; older archives lack the key: their name
    decides) and, with ``state_dir``, names ``state_dir`` (resolved paths)."""
    from gateway.backup.check import peek_manifest
    manifest = peek_manifest(archive) or {}
    if manifest.get("scheduled") is False or (state_dir is not None and not manifest):
        return False
    if state_dir is None:
        return True
    named = manifest.get("state_dir")
    if not isinstance(named, str):
        return False
    try:
        return Path(named).resolve() == state_dir.resolve()
    except (OSError, RuntimeError):
        return False


def write_last(state_dir: Path, record: dict[str, Any]) -> None:
    try:
        atomic_write(state_dir / LAST_FILE, json.dumps(record).encode(), durable=False)
    except OSError as exc:
        log.warning("backup_last_unwritable", path=str(state_dir / LAST_FILE), error=str(exc))


def load_last(state_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, problem)`` of ``backup-last.json``: ``(None, None)`` when there is none
    (never backed up); ``(None, "<path>: ...")`` when it cannot be read or its values are
    of the wrong type (a hand edit, a damaged disk): the last backup's result is then
    unknown, and only the backup report says so. Never raises."""
    path = state_dir / LAST_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else \
            f"not JSON: {exc}"
        return None, _unknown(path, why)
    bad = _bad_fields(data)
    return (None, _unknown(path, bad)) if bad else (data, None)


def _bad_fields(data: Any) -> str | None:
    """What is wrong with a parsed ``backup-last.json``, or None."""
    if not isinstance(data, dict):
        return "not a JSON object"
    at = data.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) \
            or at <= 0:
        return f'"at" is {at!r}, not a time in epoch seconds'
    if not isinstance(data.get("ok"), bool):
        return f'"ok" is {data.get("ok")!r}, not true or false'
    for key in ("file", "error"):
        if data.get(key) is not None and not isinstance(data[key], str):
            return f'"{key}" is {data[key]!r}, not text'
    return None


def _unknown(path: Path, why: str) -> str:
    return (f"backup: the last backup's result is unknown: {path} cannot be used ({why}); "
            "the next backup rewrites it")


def read_last(state_dir: Path) -> dict[str, Any] | None:
    """The last backup's record, or None (never backed up, or unusable: :func:`load_last`
    says which)."""
    return load_last(state_dir)[0]


def summary(state_dir: Path, now: float, schedule: str | None = None,
            next_at: float | None = None) -> dict[str, Any]:
    """What ``status`` shows: ``{"last_at", "age_s", "ok", "file", "error", "schedule",
    "next_at", "problem"}`` (times RFC 3339; None where there is none; ``problem``: the
    record cannot be used, ``ok`` is None then)."""
    last, problem = load_last(state_dir)
    last = last or {}
    at = last.get("at")
    return {"last_at": utc_iso(at) if at else None,
            "age_s": round(now - at, 1) if at else None,
            "ok": last.get("ok"), "file": last.get("file"), "error": last.get("error"),
            "schedule": schedule, "next_at": utc_iso(next_at) if next_at else None,
            "problem": problem}


class BackupService:
    """Fires ``backup.schedule`` on the gateway's clock; the backup itself runs in a
    thread (the event loop keeps serving). ``ran`` is set after each run (tests).
    :meth:`reconfigure` (a reload) starts, stops or reschedules the loop at once; a
    backup already running finishes first, and the loop then reads the new schedule."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.next_at: float | None = None
        self.ran = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._busy = False  # a scheduled backup is running (never cancelled mid-way)
        self._applied: tuple[str | None, str] | None = None

    async def start(self) -> None:
        cfg = self.gw.config.backup
        self._applied = (cfg.schedule, cfg.tz)
        if cfg.schedule and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._loop())
            await asyncio.sleep(0)  # the loop sets next_at before it sleeps: status shows it

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.next_at = None

    async def reconfigure(self) -> None:
        """Apply a reloaded ``backup.schedule``/``backup.tz``: a new schedule starts the
        loop, none stops it, a changed one re-reads the next slot now."""
        cfg = self.gw.config.backup
        if (cfg.schedule, cfg.tz) == self._applied:
            return
        if not self._busy:
            await self.stop()
        log.info("backup_schedule_changed", schedule=cfg.schedule, tz=cfg.tz)
        await self.start()  # while busy: the running loop reads it after its backup

    async def _loop(self) -> None:
        from scheduler.cron import crontab
        clock = self.gw.clock
        while True:
            cfg = self.gw.config.backup
            if not cfg.schedule:
                self.next_at = None
                return
            try:
                self.next_at = crontab.next_fire(cfg.schedule, clock.time(), cfg.tz)
            except Exception:
                self.next_at = None
                log.exception("backup_schedule_failed", schedule=cfg.schedule)
                return
            await clock.sleep(self.next_at - clock.time())
            self._busy = True
            try:
                await self.run_once(scheduled=True)
            except Exception:  # never let one backup end the schedule
                log.exception("backup_failed", error="unexpected error")
                self.ran.set()
            finally:
                self._busy = False

    async def create(self, *, dest: Path | None = None, include_secrets: bool | None = None,
                     scheduled: bool = False, overwrite: bool = False) -> Created:
        """One backup now, in a thread, taken at one instant (``cut.py``); see
        :func:`run_backup`. Raises BackupError."""
        from gateway.backup.cut import cut_hook
        gw = self.gw
        hook = cut_hook(gw, asyncio.get_running_loop())
        return await asyncio.to_thread(run_backup, gw.config, gw.state_dir, dest=dest,
                                       include_secrets=include_secrets, scheduled=scheduled,
                                       now=gw.clock.time(), overwrite=overwrite, cut=hook)

    async def run_once(self, *, scheduled: bool = False) -> Created | None:
        """One backup now (logged; a failure is recorded, not raised)."""
        try:
            made = await self.create(scheduled=scheduled)
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
        last, problem = load_last(self.gw.state_dir)
        if problem:
            return [problem]
        if last and last.get("ok") is False and last.get("scheduled"):
            return [f"backup: the last scheduled backup failed ({last.get('error')})"]
        return []
