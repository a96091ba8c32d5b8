"""Inbound messages that were accepted but never ran because the gateway stopped: kept in
``<state_dir>/pending-inbound.json`` and queued again at the next start, so a message a
platform already considers delivered (Slack acks before we run it) is not lost."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import structlog

from gateway.routing import Route
from gateway.work import UserWork
from runtime.fsutil import atomic_write

log = structlog.get_logger(__name__)

FILE_NAME = "pending-inbound.json"


def save_pending(state_dir: Path, items: list[tuple[str, Any]]) -> int:
    """Write the platform messages among ``items`` (``(session_key, payload)``); returns
    how many were kept. Local messages are left out: their caller got an error."""
    rows = []
    for key, work in items:
        if isinstance(work, UserWork) and work.route is not None:
            row = dataclasses.asdict(work)
            row["route"] = work.route.as_dict()
            rows.append({"session_key": key, "work": row})
    if rows:
        atomic_write(state_dir / FILE_NAME, json.dumps(rows, ensure_ascii=False).encode())
        log.warning("pending_inbound_saved", count=len(rows))
    return len(rows)


def take_pending(state_dir: Path) -> list[tuple[str, UserWork]]:
    """Read and remove the saved messages. A corrupt file is renamed aside and reported."""
    path = state_dir / FILE_NAME
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except ValueError as exc:
        path.rename(path.with_suffix(".corrupt"))
        log.error("pending_inbound_unreadable", path=str(path), error=str(exc))
        return []
    out = []
    for row in rows:
        work = dict(row["work"])
        work["route"] = Route.from_dict(work.get("route"))
        out.append((row["session_key"], UserWork(**work)))
    path.unlink()
    return out
