"""The intake journal's outcome rows and dead letters (docs/outcomes.md).

Every accepted message ends in exactly one recorded outcome. For a journaled (platform)
message that outcome *is* its entry's ``done`` record, which then carries the row::

    {"op": "done", "id": "<entry id>", "ts": <epoch s>, "outcome": "replied",
     "detail": "...", "session_key": "...", "accepted_at": <epoch s>, "channel": "...",
     "message_id": "..."|null, "agent": "..."}

A message of a surface that is not journaled (CLI, webchat, the OpenAI API) gets the same
record with ``"local": true`` and an id of its own. A ``dead-lettered`` row also keeps the
message (``work``) and its failed attempts (``crashes``) until it is dropped or
resubmitted (``{"op": "drop", "id": ...}``). Compaction writes the kept rows back, so the
last :data:`KEPT` rows (and every dead letter) survive it; older rows live on in each
session's timeline (``OUTCOME`` events).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

OUTCOMES = ("replied", "silent", "refused", "failed", "interrupted", "dead-lettered")
"""Every outcome an accepted message can end in."""

KEPT = 10_000  # outcome rows kept in the journal (the newest)
ROW_FIELDS = ("id", "ts", "outcome", "detail", "session_key", "accepted_at", "channel",
              "message_id", "agent", "local")
DEAD_AFTER = 3  # crashes of the same kind that set a message aside


def crash_signature(tools: list[str]) -> str:
    """How an attempt ended when the process died during it: ``tool:<name>`` (the last
    side-effecting tool that began) or ``turn`` (no such tool had begun)."""
    return f"tool:{tools[-1]}" if tools else "turn"


def charged(attempts: list[tuple[str, str, str | None]]) -> set[str]:
    """Whom one death of the process is charged to (docs/outcomes.md "Dead letters";
    gateway/cluster/crashes.py applies the same rule to replicas' rows). ``attempts``:
    ``(entry id, turn, signature)`` of every entry that was running in the process when
    it died: ``turn`` names the turn the entry was part of (its run id: merged messages
    share one), ``signature`` is :func:`crash_signature` of its attempt, or None when its
    reply was being sent (it was running, but the turn is over). Returns the entry ids
    charged: the entries in a side-effecting tool when there are any; else, when exactly
    one turn was running, its entries; else none (several turns in the model and none in
    such a tool: the death cannot be told from an outside kill)."""
    began = [(i, s) for i, _, s in attempts if s is not None]
    tooled = {i for i, s in began if s != "turn"}
    if tooled:
        return tooled
    turns = {t for _, t, _ in attempts}
    return {i for i, _ in began} if len(turns) == 1 else set()


def dead_letter_due(crashes: list[str], current: str) -> bool:
    """Whether the attempts so far (``crashes``: earlier attempts' signatures, oldest
    first, plus ``current``, the attempt the last run died in) failed the same way
    :data:`DEAD_AFTER` times in a row."""
    last = [*crashes, current][-DEAD_AFTER:]
    return len(last) == DEAD_AFTER and len(set(last)) == 1


class OutcomeRows:
    """The newest outcome rows (at most ``kept``) and the dead letters, in memory."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = max(1, kept)
        self.rows: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.dead: dict[str, dict[str, Any]] = {}  # id -> row with "work" and "crashes"

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rec: dict[str, Any]) -> None:
        """Keep the row of a ``done`` record that has an ``outcome``."""
        row = {k: rec.get(k) for k in ROW_FIELDS if k in rec}
        self.rows[str(rec["id"])] = row
        self.rows.move_to_end(str(rec["id"]))
        if rec.get("outcome") == "dead-lettered" and "work" in rec:
            self.dead[str(rec["id"])] = {**row, "work": rec["work"],
                                         "crashes": list(rec.get("crashes") or [])}
        while len(self.rows) > self.kept:  # a dead letter's row stays until dropped
            oldest = next((k for k in self.rows if k not in self.dead), None)
            if oldest is None:
                break
            del self.rows[oldest]

    def drop(self, entry_id: str) -> dict[str, Any] | None:
        """Forget the dead letter ``entry_id`` (its outcome row stays). Returns it."""
        return self.dead.pop(entry_id, None)

    def records(self) -> list[dict[str, Any]]:
        """The ``done`` records that rebuild the rows (compaction), oldest first."""
        out = []
        for eid, row in self.rows.items():
            rec = {"op": "done", **row}
            if eid in self.dead:
                rec["work"] = self.dead[eid]["work"]
                rec["crashes"] = self.dead[eid]["crashes"]
            out.append(rec)
        return out

    def select(self, session_key: str | None = None, since: float | None = None,
               limit: int | None = None) -> list[dict[str, Any]]:
        """Rows oldest first, of ``session_key`` only and recorded at or after ``since``
        (epoch s) when given; the newest ``limit`` of them."""
        rows = [r for r in self.rows.values()
                if (session_key is None or r.get("session_key") == session_key)
                and (since is None or float(r.get("ts") or 0) >= since)]
        return rows[-limit:] if limit else rows


def read_rows(path: Any, kept: int = KEPT) -> OutcomeRows:
    """The outcome rows and dead letters in the journal file at ``path``, read without
    opening it for writing (the CLI, while no gateway runs). A missing file has none;
    unreadable lines are skipped (the gateway reports them when it loads the file)."""
    import json
    from pathlib import Path
    rows, accepted = OutcomeRows(kept), {}
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return rows
    for line in raw.splitlines():
        try:
            rec = json.loads(line)
            op, eid = rec["op"], str(rec["id"])
        except (ValueError, KeyError, TypeError):
            continue
        if op == "accept" and isinstance(rec.get("work"), dict):
            work = rec["work"]
            accepted[eid] = {"session_key": rec.get("session_key"),
                             "accepted_at": rec.get("ts"), "channel": work.get("channel"),
                             "message_id": work.get("message_id"),
                             "agent": work.get("agent_id")}
        elif op == "done" and rec.get("outcome"):
            rows.add({**accepted.pop(eid, {}), **rec})
        elif op == "drop":
            rows.drop(eid)
    return rows
