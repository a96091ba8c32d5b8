"""The cross-file checks of ``backup verify`` and ``backup restore`` (embedded storage):
what the data formats let us prove about sessions.db, the transcripts and the timeline
agreeing with each other, without false alarms on a state a crash could leave.

1. **sessions.db -> transcripts.** A session row whose counters record a finished turn
   (``turns``, ``heartbeats``, ``cron_runs``, ... > 0) has its transcript
   ``agents/<agent>/sessions/<session_id>.jsonl`` in the backup: a turn's lines are
   written before its counters are. A row without a counted turn may lack one (the
   session was created, its first line not yet written). A transcript's header, when it
   names a session id, names this one.
2. **timeline -> transcripts.** Every ``USER_INPUT`` event of the timeline (database plus
   pending log) that carries a platform ``message_id`` is in its session's transcript (a
   user message with that ``messageId``), when the backup holds that transcript: the
   transcript line is written before the event is recorded.

Not checkable, and allowed: the timeline trailing the transcripts by the turn in flight
(its events are recorded when the turn ends), counters trailing both (they are saved
every few seconds), a timeline session whose transcript was deleted.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any


def _transcripts(files: list[dict[str, Any]]) -> dict[str, str]:
    """``{session_id: path}`` of the transcripts among the manifest's files."""
    out = {}
    for f in files:
        p = PurePosixPath(f["path"])
        if len(p.parts) == 4 and p.parts[0] == "agents" and p.parts[2] == "sessions" \
                and p.suffix == ".jsonl":
            out[p.stem] = f["path"]
    return out


def check_consistency(root: Path, manifest: dict[str, Any], problems: list[str]) -> None:
    """Append a sentence to ``problems`` for each disagreement found (module docstring)
    among the files unpacked under ``root``."""
    files = manifest.get("files", [])
    transcripts = _transcripts(files)
    for f in files:
        p = PurePosixPath(f["path"])
        if f["kind"] == "sqlite" and p.name == "sessions.db" and len(p.parts) == 4:
            _check_sessions(root, f["path"], transcripts, problems)
    tl = manifest.get("timeline")
    if tl and tl.get("db") and tl["db"] != "postgres":
        _check_inputs(root, tl, transcripts, problems)


def _rows(db: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT session_key, session_id, entry FROM sessions").fetchall()
    finally:
        conn.close()


def _check_sessions(root: Path, rel: str, transcripts: dict[str, str],
                    problems: list[str]) -> None:
    try:
        rows = _rows(root / rel)
    except sqlite3.Error as exc:
        problems.append(f"{rel}: cannot be read as a session store ({exc})")
        return
    folder = PurePosixPath(rel).parent
    for key, sid, raw in rows:
        try:
            counters = json.loads(raw).get("counters") or {}
        except (ValueError, AttributeError):
            counters = {}
        finished = isinstance(counters, dict) and any(
            isinstance(v, int) and v > 0 for k, v in counters.items()
            if k in ("turns", "heartbeats") or k.endswith("_runs"))
        mine = (folder / f"{sid}.jsonl").as_posix()
        if transcripts.get(sid) != mine:
            if finished:
                problems.append(f"{rel}: session {key} ({sid}) has finished turns but its "
                                f"transcript {mine} is not in the backup")
            continue
        named = _header_id(root / mine)
        if named is not None and named != sid:
            problems.append(f"{mine}: its header names session {named}, sessions.db "
                            f"{sid}")


def _header_id(path: Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            first = json.loads(fh.readline() or b"null")
    except (OSError, ValueError):
        return None
    if isinstance(first, dict) and first.get("type") == "session" and first.get("id"):
        return str(first["id"])
    return None


def _inputs(root: Path, tl: dict[str, Any]) -> Iterator[tuple[str, int, str]]:
    """``(session_id, seq, message_id)`` of every USER_INPUT with a message id (database
    and pending log)."""
    from runtime.timeline.pending import read_pending
    conn = sqlite3.connect(f"file:{root / tl['db']}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT session_id, seq, content FROM timeline_events "
                            "WHERE event_type = 'USER_INPUT'").fetchall()
    finally:
        conn.close()
    if tl.get("pending"):
        pend = read_pending(str(root / tl["pending"]))
        rows += [(e[1], e[2], e[5]) for evs in pend.events.values() for e in evs
                 if e[4] == "USER_INPUT"]
    for sid, seq, content in rows:
        try:
            mid = json.loads(content).get("message_id")
        except (ValueError, AttributeError):
            continue
        if isinstance(mid, str) and mid:
            yield sid, int(seq), mid


def _message_ids(path: Path) -> set[str]:
    out = set()
    with open(path, "rb") as fh:
        for raw in fh:
            if b"messageId" not in raw:
                continue
            try:
                msg = json.loads(raw).get("message") or {}
            except (ValueError, AttributeError):
                continue  # a torn line a crash left: readers skip it too
            if isinstance(msg, dict) and msg.get("role") == "user" and msg.get("messageId"):
                out.add(str(msg["messageId"]))
    return out


def _check_inputs(root: Path, tl: dict[str, Any], transcripts: dict[str, str],
                  problems: list[str]) -> None:
    seen: dict[str, set[str]] = {}
    try:
        inputs = list(_inputs(root, tl))
    except sqlite3.Error as exc:
        problems.append(f"{tl['db']}: cannot be read as a timeline ({exc})")
        return
    for sid, seq, mid in inputs:
        rel = transcripts.get(sid)
        if rel is None:
            continue
        if rel not in seen:
            seen[rel] = _message_ids(root / rel)
        if mid not in seen[rel]:
            problems.append(f"{tl['db']}: session {sid} records message {mid} (seq {seq}) "
                            f"that its transcript {rel} does not hold")
            return
