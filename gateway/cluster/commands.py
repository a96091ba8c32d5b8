"""Session commands on replicas (issue 15 "Lanes"; README "Replicas"): ``/new``,
``/reset``, ``/end``, ``/model``, ``/think``, ``/verbose`` and ``/compact`` change the
session, so they run on the replica that holds the session's lane, in order with its
turns — never on whichever replica happened to receive them.

A command becomes a ``cluster_work`` row (``work`` = ``{"command": {...}}``, no inbound
dedupe key: the intake deduplicated the message; written exactly once across a retried
insert, gateway/cluster/insert_once.py) and takes the same path as a message: run here
when this replica holds (or takes) the lane lease, else queued for the holder and woken by
``NOTIFY``. The holder writes the command's outcome into the row (``work.result``) before
it marks the row done, so the replica that received it — the CLI's ``tidegate agent
/new``, the control API's session reset — answers with the holder's result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import asyncpg

from gateway.journal.tracking import work_from_dict
from gateway.routing import Route
from gateway.turns.work import CommandWork, UserWork
from runtime.turn import TurnResult

RESULT_WAIT = 120.0  # seconds the receiving replica waits for the holder's outcome


def payload(work: CommandWork) -> str:
    """The row's ``work`` JSON of a command."""
    row = {f.name: getattr(work, f.name) for f in dataclasses.fields(CommandWork)
           if f.name != "journal_id"}
    row["route"] = work.route.as_dict() if work.route else None
    return json.dumps({"command": row}, ensure_ascii=False)


def decode(value: dict[str, Any], entry_id: str) -> UserWork | CommandWork:
    """The work a ``cluster_work`` row holds: a message or a command."""
    cmd = value.get("command")
    if not isinstance(cmd, dict):
        return work_from_dict(value, entry_id)
    names = {f.name for f in dataclasses.fields(CommandWork)}
    fields = {k: v for k, v in cmd.items() if k in names and k != "journal_id"}
    fields["route"] = Route.from_dict(cmd.get("route"))
    return CommandWork(**fields, journal_id=entry_id)


async def record_result(conn: asyncpg.Connection, row_id: int, me: str,
                        result: Any) -> None:
    """Store the command's outcome in its row (fenced: only while it runs here)."""
    out = {"text": getattr(result, "text", ""), "status": getattr(result, "status", "ok"),
           "session_id": getattr(result, "session_id", "")}
    await conn.execute("UPDATE cluster_work SET work = work || jsonb_build_object('result', "
                       "$2::jsonb) WHERE id = $1 AND target = $3", row_id, json.dumps(out), me)


async def wait_result(db: Any, row_id: int, key: str, run_id: str,
                      every: float = 0.1) -> TurnResult:
    """The outcome of a command another replica runs, once its row is done."""
    loop = asyncio.get_running_loop()
    end = loop.time() + RESULT_WAIT
    while loop.time() < end:
        row = await db.retry(lambda c: c.fetchrow(
            "SELECT state, work->'result' AS result FROM cluster_work WHERE id = $1",
            row_id), what="command result")
        if row is not None and row["state"] == "done":
            out = json.loads(row["result"]) if row["result"] else {}
            return TurnResult(run_id, key, out.get("session_id", ""),
                              out.get("status", "ok"), out.get("text", ""))
        await asyncio.sleep(every)
    return TurnResult(run_id, key, "", "error", "", error="the replica running the "
                      "session did not finish the command in time")
