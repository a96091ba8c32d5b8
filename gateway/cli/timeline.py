"""``tidegate timeline``: show, verify, export, replay and rebuild from session timelines
(issue 5 "CLI" and "Recovery"; seed 000 §4 audit, replay, third-party verification).

The commands open ``<state_dir>/timeline.db`` (or ``timeline.path``) read-only, straight
from this process: SQLite's WAL mode lets them read while the daemon appends, and the hash
chain is recomputed here, not by the daemon. ``verify --file`` needs no database at all.

A SESSION argument is a session id or a session key; a key means its most recent
timeline. Times are shown in the agent's ``user_timezone`` (``--tz`` overrides).

Exit codes: 0 ok (``verify``: the chain is intact), 1 failure (broken chain, unknown
session, unreadable database, refused overwrite), 2 bad usage (bad ``--since``, ``--type``,
``--tz``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sqlite3
import sys
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gateway.cli.output import print_json, stdout_gone
from gateway.config.load import LoadedConfig
from gateway.routing import agent_of_key, canonical_key
from runtime.clock import SYSTEM_CLOCK, parse_iso, utc_iso
from runtime.storage.postgres.errors import StorageStartError
from runtime.timeline import (
    EVENT_TYPES,
    Timeline,
    TimelineError,
    TimelineInfo,
    TimelineNotFoundError,
)
from runtime.timeline.export import (
    describe_event,
    verify_export_file,
    write_export_file,
)
from runtime.timeline.replay import replay_turns


class UsageError(ValueError):
    """A bad option value (exit code 2)."""


def register(sub: Any) -> None:
    """Add the ``timeline`` command group to the CLI's subparsers (gateway/cli/main.py)."""
    p = sub.add_parser("timeline", help="session timelines: show, verify, export, replay, "
                       "rebuild a lost transcript")
    tsub = p.add_subparsers(dest="timeline_cmd", required=True, metavar="ACTION")

    sh = tsub.add_parser("show", help="events of a session (by session id or session key)")
    sh.add_argument("session", metavar="KEY|SESSION_ID", help="session key or session id")
    sh.add_argument("--json", action="store_true")
    sh.add_argument("--since", metavar="TIME",
                    help="only events at/after TIME: RFC 3339 or relative (30m, 2h, 1d)")
    sh.add_argument("--type", action="append", metavar="T",
                    help="only these event types (repeat or comma-separate: "
                         "--type TOOL_CALL,TOOL_RESULT)")
    sh.add_argument("--tz", help="timezone for the times (default: the agent's user_timezone)")

    vf = tsub.add_parser("verify", help="recompute hash chains (exit 0 when intact)",
                         epilog="Exit 0 when every chain checked is intact, 1 when one is "
                                "broken (the first broken event is named).")
    vf.add_argument("session", nargs="?", metavar="SESSION",
                    help="one session (id or key); default: every timeline")
    vf.add_argument("--file", help="check an export file offline instead (no database)")

    ex = tsub.add_parser("export", help="self-verifying export of one session")
    ex.add_argument("session", metavar="SESSION", help="session id or session key")
    ex.add_argument("--format", choices=["jsonl"], default="jsonl",
                    help="export format (jsonl: one event a line plus a verify header)")
    ex.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")

    rp = tsub.add_parser("replay", help="step-by-step playback of a session's turns")
    rp.add_argument("session", metavar="SESSION", help="session id or session key")
    rp.add_argument("--tz", help="timezone for the times (default: the agent's user_timezone)")
    rp.add_argument("--full", action="store_true", help="do not shorten long texts")

    rb = tsub.add_parser("rebuild-transcript",
                         help="rebuild a lost transcript from the timeline alone")
    rb.add_argument("session", metavar="SESSION", help="session id or session key")
    rb.add_argument("--out", metavar="PATH",
                    help="write here instead of the session's transcript path")

    ls = tsub.add_parser("list", help="timelines, newest first")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--key", help="only this session key")
    ls.add_argument("--status", choices=["active", "archived"],
                    help="only active (open) or archived (ended) timelines")
    ls.add_argument("-n", "--limit", type=int, help="at most this many timelines")
    p.set_defaults(func=cmd_timeline)


def timeline_db_path(loaded: LoadedConfig) -> Path:
    """Where the daemon keeps the timeline: ``timeline.path`` or ``<state_dir>/timeline.db``."""
    cfg = loaded.config.timeline
    return Path(cfg.path).expanduser() if cfg.path else loaded.state_dir / "timeline.db"


def cmd_timeline(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    """Run one ``tidegate timeline`` action; returns the exit code."""
    from gateway.logs.pipeline import configure_logging, reset_logging

    # Warnings only, on stderr: stdout carries the command's output (often JSON).
    configure_logging(state_dir=None, level="warning")
    try:
        if args.timeline_cmd == "verify" and args.file:
            if args.session:
                raise UsageError("give either SESSION or --file, not both")
            return _verify_file(Path(args.file))
        return asyncio.run(_with_timeline(args, loaded))
    except BrokenPipeError:  # `... | head` stopped reading: done, like any Unix filter
        return stdout_gone()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (TimelineError, LookupError, sqlite3.Error, OSError, StorageStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        reset_logging()


async def _open(loaded: LoadedConfig) -> tuple[Timeline, Any]:
    """The configured timeline, read-only, and the pool to close after it (or None)."""
    if loaded.config.storage.backend == "postgres":
        from runtime.storage.postgres.pool import open_pool
        pool = await open_pool(loaded.config.storage.model_copy(update={
            "pool": loaded.config.storage.pool.model_copy(update={"min": 1, "max": 2})}))
        try:
            return await Timeline.open_postgres(pool, SYSTEM_CLOCK, readonly=True), pool
        except Exception as exc:  # noqa: BLE001 - any asyncpg error: schema not there
            await pool.close()
            raise TimelineError(f"no usable timeline in PostgreSQL ({exc}); run "
                                "`tidegate storage migrate` or start the gateway") from None
    path = timeline_db_path(loaded)
    if not path.is_file():
        raise FileNotFoundError(f"no timeline database at {path} (the gateway creates it "
                                "when it starts with timeline.enabled)")
    return await Timeline.open_sqlite(path, SYSTEM_CLOCK, readonly=True), None


async def _with_timeline(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    tl, pool = await _open(loaded)
    try:
        action = args.timeline_cmd
        if action == "list":
            return await _list(tl, args)
        if action == "verify":
            return await _verify(tl, args.session)
        info = await resolve_session(tl, args.session)
        # The timelines row is not hashed: refuse to present a session under a row that
        # contradicts its chain (e.g. a forged session_key). ``verify`` reports it instead.
        await tl.check_info(info)
        if action == "show":
            return await _show(tl, info, args, loaded)
        if action == "export":
            return await _export(tl, info, args.output)
        if action == "replay":
            tz = _zone(args.tz, loaded, info.session_key)
            events = await tl.get_timeline(info.session_id)
            print(f"Session {info.session_key} ({info.session_id}), {info.status}, "
                  f"{info.event_count} events; times in {tz}")
            for line in replay_turns(events, ZoneInfo(tz), full=args.full):
                print(line)
            return 0
        from gateway.cli.rebuild import rebuild
        return await rebuild(tl, info, loaded, Path(args.out) if args.out else None)
    finally:
        await tl.close()
        if pool is not None:
            await pool.close()


async def resolve_session(tl: Timeline, target: str) -> TimelineInfo:
    """The timeline of session id ``target``, else the latest of session key ``target``.

    Raises LookupError when neither exists."""
    try:
        return await tl.get_info(target)
    except TimelineNotFoundError:
        pass
    info = await tl.latest_for_key(canonical_key(target))
    if info is None:
        raise LookupError(f"no timeline for session id or session key {target!r}")
    return info


def _zone(explicit: str | None, loaded: LoadedConfig, session_key: str) -> str:
    """``--tz``, else the user_timezone of the key's agent, else the defaults'."""
    if explicit:
        try:
            ZoneInfo(explicit)
        except (ZoneInfoNotFoundError, ValueError):
            raise UsageError(f"--tz: unknown IANA timezone {explicit!r}") from None
        return explicit
    try:
        return loaded.config.agent(agent_of_key(session_key)).user_timezone
    except (KeyError, ValueError):  # an agent no longer configured
        return loaded.config.agents.defaults.user_timezone


def parse_since(text: str, now: float) -> int:
    """``--since`` as ms since the epoch: RFC 3339, or a duration back from ``now``
    (epoch seconds) like ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m``. Raises UsageError."""
    from scheduler.cron.job import parse_duration

    s = text.strip()
    try:
        if s and s[0].isdigit() and not re.match(r"\d{4}-", s):
            return int((now - parse_duration(s)) * 1000)
        return int(parse_iso(s) * 1000)
    except (ValueError, TypeError):
        raise UsageError(f"--since: {text!r} is neither RFC 3339 (2026-01-02T10:00:00Z) nor "
                         "a duration (30m, 2h, 1d)") from None


def _types(values: list[str] | None) -> set[str] | None:
    if not values:
        return None
    out = {t.strip().upper() for v in values for t in v.split(",") if t.strip()}
    unknown = sorted(out - EVENT_TYPES)
    if unknown:
        raise UsageError(f"--type: unknown event type(s) {', '.join(unknown)}; expected "
                         + ", ".join(sorted(EVENT_TYPES)))
    return out


def _info_json(info: TimelineInfo) -> dict[str, Any]:
    return {"session_id": info.session_id, "session_key": info.session_key,
            "status": info.status, "created_at": utc_iso(info.created_at / 1000),
            "ended_at": utc_iso(info.ended_at / 1000) if info.ended_at else None,
            "event_count": info.event_count, "head_hash": info.last_hash}


async def _show(tl: Timeline, info: TimelineInfo, args: argparse.Namespace,
                loaded: LoadedConfig) -> int:
    since = parse_since(args.since, tl.clock.time()) if args.since else None
    types = _types(args.type)
    tz = _zone(args.tz, loaded, info.session_key)
    events = await tl.get_timeline(info.session_id, from_ts=since)
    if types is not None:
        events = [e for e in events if e.event_type in types]
    if args.json:
        body = {**_info_json(info), "events": [
            {**e.to_dict(), "time": utc_iso(e.timestamp / 1000)} for e in events]}
        print_json(body)
        return 0
    zone = ZoneInfo(tz)
    print(f"Session {info.session_key} ({info.session_id}), {info.status}, "
          f"{info.event_count} events; showing {len(events)}; times in {tz}")
    for e in events:
        local = datetime.fromtimestamp(e.timestamp / 1000, tz=zone)
        stamp = local.strftime("%Y-%m-%d %H:%M:%S") + f".{e.timestamp % 1000:03d} " + \
            local.strftime("%Z")
        print(f"#{e.seq:<5} {stamp}  {e.event_type:<14} {describe_event(e.event_type, e.content)}")
    return 0


async def _verify(tl: Timeline, target: str | None) -> int:
    sid = (await resolve_session(tl, target)).session_id if target else None
    report = await tl.verify(sid)
    print(str(report))
    if report.ok:
        return 0
    if report.session_id and report.seq:
        bad = await tl.get_timeline(report.session_id, after_seq=report.seq - 1, limit=1)
        if bad:
            e = bad[0]
            print(f"first broken event: session {e.session_id} seq {e.seq} {e.event_type} "
                  f"at {utc_iso(e.timestamp / 1000)} (event_id {e.event_id})")
    return 1


def _verify_file(path: Path) -> int:
    report = verify_export_file(path)
    print(f"{path}: {report}")
    return 0 if report.ok else 1


async def _export(tl: Timeline, info: TimelineInfo, output: str | None) -> int:
    lines = await tl.export(info.session_id)
    if output is None:
        sys.stdout.write("".join(line + "\n" for line in lines))
        return 0
    write_export_file(output, lines)
    print(f"exported {len(lines) - 1} events of {info.session_id} to {output}; check it with "
          f"`tidegate timeline verify --file {output}`", file=sys.stderr)
    return 0


async def _list(tl: Timeline, args: argparse.Namespace) -> int:
    rows = await tl.list_timelines(session_key=canonical_key(args.key) if args.key else None,
                                   status=args.status, limit=args.limit)
    if args.json:
        print_json([_info_json(r) for r in rows])
        return 0
    if not rows:
        print("no timelines yet")
        return 0
    width = max(len(r.session_key) for r in rows)
    print(f"{'SESSION ID':<36}  {'SESSION KEY':<{width}}  {'STATUS':<8}  {'EVENTS':>6}  "
          "CREATED")
    for r in rows:
        print(f"{r.session_id:<36}  {r.session_key:<{width}}  {r.status:<8}  "
              f"{r.event_count:>6}  {utc_iso(r.created_at / 1000)}")
    return 0
