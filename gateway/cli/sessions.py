"""``tidegate sessions list|show|abort|reset|export``: read the session stores (via the
running gateway's API when it is up, since its in-memory copy is the freshest; from disk
otherwise). Abort and reset always go through the running gateway."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gateway.cli.output import print_json
from gateway.config.load import LoadedConfig
from gateway.routing import canonical_key, readable_key
from gateway.service.storage import offline_sessions, offline_transcripts
from gateway.sessions.entry import SessionEntry, openclaw_entry
from runtime.fsutil import atomic_write
from runtime.storage.sessions import SessionStoreError

_SESSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
FIELDS = ("session_key", "session_id", "agent", "created_at", "updated_at", "last_active_at")


def _from_disk(loaded: LoadedConfig) -> list[dict[str, Any]]:
    rows = []
    now = 0.0
    for agent_id in loaded.config.agent_ids():
        try:
            rows += [e.to_json() for e in offline_sessions(loaded, agent_id, now).values()]
        except SessionStoreError as exc:
            raise ValueError(str(exc)) from None
    return sorted(rows, key=lambda r: r["updated_at"] or "", reverse=True)


def _rows(loaded: LoadedConfig) -> list[dict[str, Any]]:
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    try:
        return ControlClient.from_config(loaded).request("GET", "/api/sessions", timeout=10)
    except (GatewayUnavailable, ApiError):
        return _from_disk(loaded)


def list_sessions(loaded: LoadedConfig, *, agent: str | None, as_json: bool) -> int:
    try:
        rows = [r for r in _rows(loaded) if not agent or r.get("agent") == agent]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print_json(rows)
        return 0
    if not rows:
        print("no sessions yet")
        return 0
    keys = [readable_key(r["session_key"]) for r in rows]  # as typed: ...:dm:CaseUser
    width = max(len(k) for k in keys)
    print(f"{'SESSION KEY':<{width}}  {'SESSION ID':<36}  UPDATED")
    for key, r in zip(keys, rows):
        print(f"{key:<{width}}  {r['session_id']:<36}  {r['updated_at']}")
    return 0


def _earlier_session(loaded: LoadedConfig, transcripts: Any,
                     session_id: str) -> dict[str, Any] | None:
    """A session that is no longer its key's current one (an earlier isolated cron run, a
    session before /new), found by its id: the row comes from its transcript's header."""
    if not _SESSION_ID.fullmatch(session_id):
        return None
    for agent_id in loaded.config.agent_ids():
        header = transcripts.header(agent_id, session_id)
        if header is None:
            continue
        return {"session_key": header.get("session_key"), "session_id": session_id,
                "agent": agent_id, "created_at": header.get("timestamp"),
                "updated_at": None, "last_active_at": None, "current": False}
    return None


def _find(loaded: LoadedConfig, transcripts: Any, key: str) -> dict[str, Any] | None:
    """The session row of a key (its current session) or of a session id. Raises
    ValueError when the session store is unreadable."""
    return next((r for r in _rows(loaded) if key in (r["session_key"], r["session_id"])),
                None) or _earlier_session(loaded, transcripts, key)


def _read_session(loaded: LoadedConfig, key: str, read: Any) -> tuple[Any, Any] | None:
    """``(row, read(transcripts, row))`` of the session KEY (key or id; ``read`` gets
    None for ``row`` when there is no such session); None after printing why not."""
    from runtime.storage.postgres.errors import StorageUnavailable
    try:
        transcripts, close = offline_transcripts(loaded)
    except StorageUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    try:
        row = _find(loaded, transcripts, canonical_key(key))
        return row, read(transcripts, row)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    finally:
        close()


def show_session(loaded: LoadedConfig, key: str, *, as_json: bool) -> int:
    """Show a session by key (its current session) or by session id (any session whose
    transcript is kept, e.g. an earlier run of an isolated cron job)."""
    got = _read_session(loaded, key, lambda t, row: row and (
        t.location(row["agent"], row["session_id"]),
        t.tail(row["agent"], row["session_id"], 64 * 1024)))
    if got is None:
        return 1
    row, read = got
    if row is None:
        print(f"no session {canonical_key(key)!r}", file=sys.stderr)
        return 1
    where, tail = read
    _print_session({**row, "transcript": where},
                   [e for e in tail.entries if e.get("type") == "message"][-10:], as_json)
    return 0


def _plain(value: Any) -> str:
    """One field as an operator reads it: ``-`` for none, lists and mappings as
    ``a, b`` / ``k v`` (never a Python repr)."""
    if value is None or value == "":
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items() if v is not None) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(v) for v in value) or "-"
    return str(value)


def _route_text(route: Any) -> str:
    """A session's last route (``Route.as_dict()``) as ``channel:account to <chat>``
    (``, thread <id>``); ``-`` when the session has none (nothing to deliver to)."""
    if not isinstance(route, dict) or not route.get("channel"):
        return _plain(route)
    text = f"{route['channel']}:{route.get('account') or 'default'} to {route.get('to')}"
    return text + (f", thread {route['thread']}" if route.get("thread") else "")


def _print_session(row: dict[str, Any], recent: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print_json({**row, "recent": recent})
        return
    for k in (*FIELDS, "chat_type", "display_name", "model_override"):
        if k in FIELDS or row.get(k) not in (None, ""):
            print(f"{k}: {_plain(row.get(k))}")
    print(f"last_route: {_route_text(row.get('last_route'))}")
    counters = row.get("counters") or {}
    print("counters: " + (", ".join(f"{k} {_plain(v)}" for k, v in sorted(counters.items()))
                          or "none"))
    print(f"transcript: {_plain(row.get('transcript'))}")
    if recent:
        print("recent messages:")
    for e in recent:
        m = e["message"]
        text = "".join(p.get("text", "") for p in m.get("content", [])
                       if isinstance(p, dict) and p.get("type") == "text")
        calls = [p["name"] for p in m.get("content", []) if isinstance(p, dict)
                 and p.get("type") == "toolCall"]
        extra = f" [tools: {', '.join(calls)}]" if calls else ""
        print(f"  {e['timestamp']} {m.get('role')}: {text[:200]}{extra}")


def export_transcript(loaded: LoadedConfig, key: str, *, output: str | None) -> int:
    """``tidegate sessions export KEY``: the session's transcript as the OpenClaw-v3 JSONL
    a single host keeps (byte-identical whichever storage backend holds it), to
    ``output`` (atomically) or stdout. KEY is a session key or session id."""
    got = _read_session(loaded, key, lambda t, row: row and t.export(row["agent"],
                                                                    row["session_id"]))
    if got is None:
        return 1
    row, data = got
    if data is None:
        print(f"no transcript for {canonical_key(key)!r}", file=sys.stderr)
        return 1
    if output in (None, "-"):
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        atomic_write(Path(output), data)
        lines = data.count(b"\n")
        print(f"wrote {lines} line(s) of {row['session_id']} to {output}", file=sys.stderr)
    return 0


def abort_session(loaded: LoadedConfig, key: str, *, drop_queued: bool, as_json: bool) -> int:
    """``tidegate sessions abort KEY [--all]``: what ``/stop`` does, from the shell."""
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    from gateway.inbound.intake import stop_reply
    try:
        out = ControlClient.from_config(loaded).request(
            "POST", f"/api/sessions/{quote(canonical_key(key), safe=':')}/abort",
            {"all": drop_queued}, timeout=10)
    except (GatewayUnavailable, ApiError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print_json(out)
    else:
        print(stop_reply(out))
    return 0


def reset_session(loaded: LoadedConfig, key: str, *, as_json: bool) -> int:
    """``tidegate sessions reset KEY``: through the running gateway (its session store and
    lane own the session), like ``/reset`` in that chat."""
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    try:
        out = ControlClient.from_config(loaded).request(
            "POST", f"/api/sessions/{quote(key, safe='')}/reset", timeout=120)
    except (GatewayUnavailable, ApiError) as exc:
        hint = "" if isinstance(exc, ApiError) else " (a reset needs the running gateway)"
        print(f"error: {exc}{hint}", file=sys.stderr)
        return 1
    if as_json:
        print_json(out)
    else:
        print(f"reset {out['session_key']}: new session {out['session_id']} (the old "
              f"transcript {out['old_session_id']}.jsonl stays on disk)")
    return 0


def export_sessions(loaded: LoadedConfig, *, agent: str, fmt: str,
                    output: str | None) -> int:
    """Write one agent's sessions as OpenClaw's ``sessions.json`` (``{session_key:
    {sessionId, updatedAt (epoch ms), ...}}``) to ``output`` (atomically) or stdout."""
    if fmt != "openclaw":
        print(f"error: unknown export format {fmt!r} (have: openclaw)", file=sys.stderr)
        return 2
    try:
        rows = [r for r in _rows(loaded) if r.get("agent") == agent]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    doc = {r["session_key"]: openclaw_entry(SessionEntry.from_json(r["session_key"], r,
                                                                   agent, 0.0))
           for r in rows}
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if output in (None, "-"):
        sys.stdout.write(text)
    else:
        atomic_write(Path(output), text.encode())
        print(f"wrote {len(doc)} session(s) to {output}", file=sys.stderr)
    return 0

