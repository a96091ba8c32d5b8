"""Dead letters: a message whose turn failed the same way 3 times is set aside instead of
being replayed at every start (docs/outcomes.md "Dead letters").

"Failed" here is the one failure the journal replays: the process died during the turn
(a crash in a tool, an out-of-memory kill, a watchdog restart). Each attempt the process
died in and the death is charged to (the bystander rule,
:func:`gateway.journal.outcomes.charged`, applied when the journal is loaded) is
remembered with how far it got (``tool:<name>``, the last side-effecting tool that
began, or ``turn``); when the last 3 are the same, the message is ``dead-lettered``
at start: its outcome row keeps the message, the user gets one notice, and the operator
sees it in ``tidegate status`` and ``tidegate channels dead-letters list``. ``resubmit``
accepts it again as a new message (a new journal entry, a fresh count); ``drop`` forgets
it. Both leave its ``dead-lettered`` outcome row in place.
"""

from __future__ import annotations

from typing import Any

import structlog

from gateway.journal.outcomes import DEAD_AFTER, dead_letter_due
from gateway.journal.store import JournalEntry
from gateway.journal.tracking import work_from_dict

log = structlog.get_logger(__name__)

DEAD_LETTER_NOTICE = ("⚠️ I could not process your message: the gateway failed on it "
                      f"{DEAD_AFTER} times in the same way. It was set aside for the "
                      "operator, who can look at it and send it again.")


def due(entry: JournalEntry) -> bool:
    """Whether the unfinished ``entry`` (as loaded: the last death accounted,
    gateway/journal/store.py) is to be set aside now: the last 3 deaths charged to its
    turn happened the same way."""
    return entry.started and not entry.replying and bool(entry.crashes) and \
        dead_letter_due(entry.crashes[:-1], entry.crashes[-1])


async def set_aside(gw: Any, entry: JournalEntry) -> None:
    """Dead-letter ``entry`` (see the module docstring). ``gw`` offers ``outcomes``,
    ``deliverer``."""
    crashes = list(entry.crashes)
    work = entry.work if isinstance(entry.work, dict) else {}
    await set_aside_message(gw, entry.id, entry.session_key, work, crashes)


async def set_aside_row(gw: Any, row: Any, crashes: list[str]) -> None:
    """Dead-letter a ``cluster_work`` row that PostgreSQL storage set aside at a takeover
    (gateway/cluster/crashes.py; ``row``: its id, session_key, work)."""
    import json
    raw = row["work"]
    work = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
    await set_aside_message(gw, str(row["id"]), str(row["session_key"]), work, crashes)


async def set_aside_message(gw: Any, entry_id: str, session_key: str, work: dict[str, Any],
                            crashes: list[str]) -> None:
    """Record the ``dead-lettered`` outcome of the message ``work`` (its journal or work
    row ``entry_id``; ``crashes``: the attempts' signatures, oldest first), log it and
    send the user the one notice."""
    detail = (f"the gateway died {len(crashes)} times during its turn, each time at "
              f"{crashes[-1]}; set aside")
    gw.outcomes.record_message(
        {"journal_id": entry_id, "channel": work.get("channel"),
         "message_id": work.get("message_id"), "agent": work.get("agent_id"),
         "work": work, "crashes": crashes},
        "dead-lettered", detail, session_key=session_key)
    log.error("message_dead_lettered", session_key=session_key, entry_id=entry_id,
              crashes=crashes, channel=work.get("channel"), message_id=work.get("message_id"),
              fix=f"tidegate channels dead-letters show {entry_id}")
    try:
        w = work_from_dict(work, entry_id)
    except (TypeError, ValueError):
        return
    if w.route is not None:
        await gw.deliverer.send(w.route, DEAD_LETTER_NOTICE, kind="notice",
                                session_key=session_key)


def listing(journal: Any) -> list[dict[str, Any]]:
    """The dead letters, oldest first: their outcome rows plus ``crashes`` and the
    message ``text`` (no other part of the message)."""
    return [{**{k: v for k, v in d.items() if k != "work"},
             "text": (d.get("work") or {}).get("text", "")}
            for d in journal.outcomes.dead.values()]


def find(journal: Any, entry_id: str) -> dict[str, Any] | None:
    """One dead letter by its id (or a unique prefix of it), with the whole message."""
    dead = journal.outcomes.dead
    if entry_id in dead:
        return dead[entry_id]
    hits = [v for k, v in dead.items() if k.startswith(entry_id)] if len(entry_id) >= 4 else []
    return hits[0] if len(hits) == 1 else None


async def resubmit(gw: Any, entry_id: str) -> str | None:
    """Accept the dead letter ``entry_id`` again as a new message on its session's lane
    (a new journal entry, durable before this returns) and forget the dead letter.
    Returns the new entry id, None for an unknown id (or one another resubmit took just
    now: it runs once). Raises ValueError for a message that cannot be read back."""
    dead = find(gw.journal, entry_id)
    if dead is None:
        return None
    key = str(dead["session_key"])
    work = work_from_dict(dict(dead["work"]), "")  # unreadable: raises, nothing changed
    entry = gw.journal.accept(key, dict(dead["work"]))
    work.journal_id = entry.id
    # claimed before the await: a second resubmit meanwhile finds no dead letter
    gw.journal.drop_dead(str(dead["id"]))
    await gw.journal.durable()
    log.warning("dead_letter_resubmitted", session_key=key, entry_id=dead["id"],
                new_entry_id=entry.id)
    fut = gw.lanes.submit(key, work)
    gw.outcomes.watch(work, key, fut)
    return entry.id


def drop(gw: Any, entry_id: str) -> bool:
    """Forget the dead letter ``entry_id`` (its outcome row stays). False: unknown id."""
    dead = find(gw.journal, entry_id)
    if dead is None:
        return False
    gw.journal.drop_dead(str(dead["id"]))
    log.warning("dead_letter_dropped", session_key=dead.get("session_key"),
                entry_id=dead["id"])
    return True
