"""``tidegate doctor``'s checks of stored state: the timeline (chains of the
``TIMELINE_SAMPLE`` most recent sessions verified, on SQLite or PostgreSQL), torn
transcript lines, corrupt JSON state files, and the outbox (backlog, a waiting spill).
Each takes the doctor's context dict and returns its findings."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from gateway.cli.doctor.finding import Finding

TIMELINE_SAMPLE = 20


async def _verify_sample(tl: Any, where: str) -> list[Finding]:
    """Verify the ``TIMELINE_SAMPLE`` most recent timelines of the open Timeline ``tl``
    (read-only; on SQLite its pending log is read alongside the database, so events not
    yet committed by the running gateway's group commit count too)."""
    infos = await tl.store.timelines(limit=TIMELINE_SAMPLE)
    events = 0
    for info in infos:
        report = await tl.store.verify(info.session_id)
        if not report.ok:
            return [Finding("timeline", "error", f"session {info.session_id}: "
                            f"{report.reason} at seq {report.seq}", "keep the database "
                            f"as evidence; tidegate timeline verify {info.session_id} "
                            "names the event")]
        events += report.events_checked
    return [Finding("timeline", "ok", f"{len(infos)} most recent timelines verified{where}: "
                    f"{events} event{'' if events == 1 else 's'}")]


async def _pg_timeline(loaded: Any) -> list[Finding]:
    """The PostgreSQL timeline (storage.backend postgres): the same sample verified."""
    from runtime.storage.postgres.pool import open_pool
    from runtime.timeline import Timeline
    pool = await open_pool(loaded.config.storage.model_copy(update={
        "pool": loaded.config.storage.pool.model_copy(update={"min": 1, "max": 1})}))
    try:
        return await _verify_sample(await Timeline.open_postgres(pool, readonly=True),
                                    " (PostgreSQL)")
    finally:
        await pool.close()


async def _sqlite_timeline(path: Path) -> list[Finding]:
    from runtime.timeline import Timeline
    tl = await Timeline.open_sqlite(path, readonly=True)
    try:
        return await _verify_sample(tl, "")
    finally:
        await tl.close()


def check_timeline(ctx: dict[str, Any]) -> list[Finding]:
    loaded = ctx.get("loaded")
    if loaded and loaded.config.storage.backend == "postgres":
        try:
            return asyncio.run(_pg_timeline(loaded))
        except Exception as exc:  # noqa: BLE001 - unreachable, not migrated: one finding
            return [Finding("timeline", "error", f"PostgreSQL timeline: {exc}", "check "
                            "storage.dsn and `tidegate storage status`")]
    path = Path(loaded.config.timeline.path).expanduser() if loaded and \
        loaded.config.timeline.path else ctx["state_dir"] / "timeline.db"
    if not path.exists():
        return [Finding("timeline", "ok", "no timeline yet")]
    failing = _gateway_timeline_problems(loaded)
    try:
        found = asyncio.run(_sqlite_timeline(path))
    except sqlite3.DatabaseError as exc:
        return [Finding("timeline", "error", f"{path}: {exc}", "restore timeline.db from a "
                        "backup (the gateway reports it in status.problems)")]
    return failing + found if failing else found


def _gateway_timeline_problems(loaded: Any) -> list[Finding]:
    """The running gateway's timeline problems (its commits to timeline.db failing), read
    from its ``/status``; [] when it is not running or does not answer."""
    if loaded is None:
        return []
    from gateway.cli.client import ControlClient
    try:
        status = ControlClient.from_config(loaded).request("GET", "/status", timeout=5.0)
    except Exception:  # noqa: BLE001 - not running, unreachable: the lock check says so
        return []
    return [Finding("timeline", "error", p, "see the gateway's log (timeline_flush_failed); "
                    "a restart replays the pending log")
            for p in (status or {}).get("problems", []) if str(p).startswith("timeline:")]


def check_transcripts(ctx: dict[str, Any]) -> list[Finding]:
    torn = []
    for path in sorted(ctx["state_dir"].glob("agents/*/sessions/*.jsonl")):
        with open(path, "rb") as fh:
            for no, raw in enumerate(fh, 1):
                try:
                    json.loads(raw)
                except ValueError:
                    torn.append(f"{path.name} line {no}")
                    break
    if torn:
        return [Finding("transcripts", "warning", f"torn lines (skipped when read): "
                        f"{', '.join(torn[:5])}", "none needed: readers skip them and the "
                        "next append starts on a fresh line; transcripts are never "
                        "rewritten")]
    return [Finding("transcripts", "ok", "every transcript line parses")]


# JSON state files the gateway replaces atomically, and what each holds
STATE_FILES = {"cron/jobs.json": "the cron jobs (cron stays disabled: no job fires)",
               "auth-state.json": "persisted profile cooldowns",
               "subagents/runs.json": "subagent run records",
               "channels/activation.json": "group activation settings",
               "usage/budget_state.json": "budget overrides and alerts"}


def check_state_files(ctx: dict[str, Any]) -> list[Finding]:
    out = []
    for rel, owner in STATE_FILES.items():
        path = ctx["state_dir"] / rel
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            out.append(Finding("state", "error", f"{path} is corrupt ({exc}); it holds "
                               f"{owner}", f"repair the JSON or "
                               f"move it away (mv {path} {path}.bad), then restart the "
                               f"gateway"))
    return out or [Finding("state", "ok", "every JSON state file parses")]


def _outbox_waiting(ctx: dict[str, Any]) -> tuple[int, float]:
    """(replies waiting, creation time of the oldest) from the configured store."""
    loaded = ctx.get("loaded")
    if loaded is not None and loaded.config.storage.backend == "postgres":
        from gateway.service.storage import offline_records
        from runtime.clock import parse_iso
        entries = offline_records(loaded, "outbox").peek()
        stamps = [parse_iso(e["created_at"]) for e in entries if e.get("created_at")]
        return len(entries), min(stamps, default=0.0)
    files = list((ctx["state_dir"] / "outbox").glob("*.json"))
    return len(files), min((p.stat().st_mtime for p in files), default=0.0)


def check_outbox(ctx: dict[str, Any]) -> list[Finding]:
    return [*_spill_waiting(ctx), *_outbox_backlog(ctx)]


def _spill_waiting(ctx: dict[str, Any]) -> list[Finding]:
    """Outbox writes PostgreSQL refused, waiting on local disk (channels/outbound/spill.py)."""
    from channels.outbound.spill import spill_summary
    outbox = ctx["state_dir"] / "outbox"
    try:
        waiting = spill_summary(outbox, ctx.get("now", time.time()))
    except (OSError, ValueError) as exc:
        return [Finding("outbox", "error", f"the outbox spill file is unreadable ({exc})",
                        "the gateway sets it aside as .corrupt at its next start")]
    if waiting is None:
        return []
    return [Finding("outbox", "error", f"{waiting[0]} outbox writes wait in {outbox}/"
                    f"pending-spill.jsonl, oldest {int(waiting[1])} s: PostgreSQL refused "
                    "them", "start PostgreSQL (check storage.dsn); the gateway re-submits "
                    "them once it is reachable; do not delete the file")]


def _outbox_backlog(ctx: dict[str, Any]) -> list[Finding]:
    try:
        count, oldest = _outbox_waiting(ctx)
    except Exception as exc:  # noqa: BLE001 - PostgreSQL unreachable: say so
        return [Finding("outbox", "warning", f"cannot read the outbox: {exc}",
                        "check storage.dsn and that PostgreSQL is up")]
    if count:
        age = int(ctx.get("now", time.time()) - oldest)
        return [Finding("outbox", "warning", f"{count} replies waiting, oldest "
                        f"{age // 60} min", "check `tidegate channels status --probe`; "
                        "they are sent when the platform is back")]
    return [Finding("outbox", "ok", "empty")]


def check_backup(ctx: dict[str, Any]) -> list[Finding]:
    """The last backup (``backup-last.json``): its age and file; an error when it failed,
    a warning when overdue (a whole ``backup.schedule`` slot missed; 7 days without a
    schedule). None made yet is ok (with the hint)."""
    from gateway.backup.service import load_last
    loaded = ctx.get("loaded")
    last, problem = load_last(ctx["state_dir"])
    fix = "tidegate backup create (and set backup.schedule, e.g. '0 3 * * *')"
    if problem:
        return [Finding("backup", "warning", problem.removeprefix("backup: "),
                        "tidegate backup create (it rewrites the record)")]
    if not last or not last.get("at"):  # a fresh install is not unhealthy
        return [Finding("backup", "ok", f"no backup made yet ({fix})")]
    at, now = float(last["at"]), ctx.get("now", time.time())
    age = f"{(now - at) / 3600:.1f} h ago"
    if not last.get("ok"):
        return [Finding("backup", "error", f"the last backup ({age}) failed: "
                        f"{last.get('error')}", "fix the cause, then tidegate backup create")]
    schedule = loaded.config.backup.schedule if loaded else None
    due = at + 7 * 86400
    if schedule:
        from scheduler.cron import crontab
        tz = loaded.config.backup.tz
        first = crontab.next_fire(schedule, at, tz)
        due = crontab.next_fire(schedule, first, tz) + 60  # a whole slot missed
    if now > due:
        return [Finding("backup", "warning", f"the last backup is overdue ({age}; "
                        f"{last.get('file')})", "is the gateway running? " + fix)]
    return [Finding("backup", "ok", f"last backup {age}: {last.get('file')}")]
