"""Dead letters with replicas (docs/outcomes.md "Dead letters"): the crash count of work
rows taken over from a process that died, in PostgreSQL.

On one host the intake journal remembers, for each attempt the process died in, how far
the turn got (gateway/journal/dead_letters.py). With PostgreSQL storage the rows are
``cluster_work`` rows and a dead process's rows are taken over (gateway/cluster/
takeover.py, adopt.py) by the restarted process or another replica; without a count
there, a poison message was replayed at every takeover and took every process down in
turn, for ever. So when rows of a dead process are taken over, each row whose attempt
had started gets that attempt's signature (``tool:<name>``, the last side-effecting tool
of the attempt, or ``turn``) appended to ``crashes``; when the last 3 agree, the row is
set aside (``state = 'done'``) and returned as a dead letter, for the taking replica to
record (outcome ``dead-lettered``, the user's one notice).

Whom a death is charged to: the process dies once for every turn running in it, and
most deaths are not any turn's doing (a ``kill -9``, the out-of-memory killer taking the
biggest process, a host going down). A death is charged only to the turns it can be
pinned on: when any attempt of the dead process had begun a side-effecting tool, to
those attempts (``tool:<name>``; the turns beside them are run again without a count, so
a poison message does not drag the messages of other sessions into the dead letters);
else, when exactly one turn was running (``turn``), to that one; a death while several
turns were running and none had begun such a tool is charged to none of them (it cannot
be told from an outside kill). "Running" counts every open row of the dead process that
began (its other sessions' rows too, not only the rows this transaction locked) and the
rows whose reply was being sent. A turn is counted once however many rows it answers:
rows merged into one turn (collect, steer, an album) share its run id (``run_id``,
written with their started mark), exactly as the intake journal counts per turn
(:func:`gateway.journal.outcomes.charged`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from gateway.journal.outcomes import charged as journal_charged
from gateway.journal.outcomes import crash_signature, dead_letter_due

COLUMNS = "crashes, attempt_from, attempts, attempts_seen, run_id"


def attempt_signature(row: Any) -> str:
    """How the current attempt of ``row`` ended when its process died."""
    tools = list(row["tools"] or [])
    return crash_signature(tools[int(row["attempt_from"] or 0):])


def began(row: Any) -> bool:
    """Whether an attempt of ``row`` began since its last takeover: its started mark
    (which counts ``attempts``) was written, or a side-effecting tool's was (awaited
    before the tool runs, while the started mark is batched and may not be written yet
    when the process dies)."""
    return not row["replying"] and (
        int(row["attempts"] or 0) > int(row["attempts_seen"] or 0)
        or len(row["tools"] or []) > int(row["attempt_from"] or 0))


def running(row: Any) -> bool:
    """Whether ``row`` was running when its process died: an attempt began, or its reply
    was being sent."""
    return began(row) or bool(row["replying"])


def turn_of(row: Any) -> str:
    """The turn ``row``'s current attempt runs in: its run id, else (a row marked before
    run ids were kept) the row itself."""
    return str(row["run_id"] or f"row:{row['id']}")


def charged(rows: Sequence[Any]) -> set[int]:
    """Ids of the started rows among ``rows`` (every open row of one dead process) that
    its death is charged to: the module docstring's rule, the intake journal's
    (:func:`gateway.journal.outcomes.charged`) applied to the rows."""
    return journal_charged([(r["id"], turn_of(r),
                             attempt_signature(r) if began(r) else None)
                            for r in rows if running(r)])


_BESIDE = (f"SELECT id, session_key, target, replying, tools, work, {COLUMNS} FROM "
           "cluster_work WHERE state <> 'done' AND NOT id = ANY($1::bigint[]) AND ")


async def beside(conn: asyncpg.Connection, target: str | None, ids: list[int]) -> list[Any]:
    """The other open rows of the dead process ``target`` (``ids``: the rows locked), not
    locked. ``None``: the rows a restarted process of the same replica id left without
    an owner at its start (gateway/cluster/membership.py ``rejoin``), its previous
    life's."""
    if target is None:
        return list(await conn.fetch(_BESIDE + "target IS NULL", ids))
    return list(await conn.fetch(_BESIDE + "target = $2", ids, target))


async def lock_began(conn: asyncpg.Connection, rows: Sequence[Any]) -> list[Any]:
    """Of ``rows`` (read by :func:`beside`), those whose attempt began, locked and read
    again; those another transaction holds are skipped (it counts them itself)."""
    ids = [r["id"] for r in rows if began(r)]
    if not ids:
        return []
    return list(await conn.fetch(
        _BESIDE.replace("NOT id = ANY($1::bigint[])", "id = ANY($1::bigint[])")
        + "true ORDER BY id FOR UPDATE SKIP LOCKED", ids))


async def account(conn: asyncpg.Connection, rows: Sequence[Any]) -> tuple[list[Any], set[int]]:
    """Inside the caller's transaction, for rows locked from dead processes: count the
    death of their process on the started rows it is charged to (grouped by the process
    they ran in, ``target``; :func:`charged`), start a new attempt of each started row,
    set aside those due. The process's other started rows (other sessions, when the
    caller routes one session's rows) are counted at once too, so that the first
    takeover of a death sees every turn it cut off. Returns ``(dead letters as (row,
    crashes), their ids)``; the caller requeues the other rows it locked as before."""
    by_target: dict[Any, list[Any]] = {}
    for r in rows:
        by_target.setdefault(r["target"], []).append(r)
    dead: list[Any] = []
    for target, group in by_target.items():
        others = await beside(conn, target, [r["id"] for r in group])
        blamed = charged([*group, *others])
        for r in [*group, *await lock_began(conn, others)]:
            if not began(r):
                continue
            crashes = list(r["crashes"] or [])
            sig = attempt_signature(r)
            if r["id"] in blamed:
                if dead_letter_due(crashes, sig):
                    dead.append((r, [*crashes, sig]))
                    continue
                crashes.append(sig)
            await conn.execute(
                "UPDATE cluster_work SET crashes = $2, attempt_from = cardinality(tools), "
                "attempts_seen = attempts WHERE id = $1", r["id"], crashes)
    ids = {r["id"] for r, _ in dead}
    for r, crashes in dead:
        await conn.execute("UPDATE cluster_work SET state = 'done', done_at = now(), "
                           "crashes = $2 WHERE id = $1", r["id"], crashes)
    return dead, ids
