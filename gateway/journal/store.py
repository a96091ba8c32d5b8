"""The write-ahead intake journal: one append-only JSON-lines file,
``<state_dir>/intake-journal.jsonl`` (issue 8 "Crash and shutdown lose accepted messages";
README "Delivery guarantees").

Every platform message that becomes a turn is appended (``accept``) and made durable
(fsync, group-committed) before the adapter acknowledges it to the platform; its turn then
adds ``start``, ``tool`` (a side-effecting tool began), ``reply`` (delivery began) and
finally ``done``. Record shapes, one JSON object a line::

    {"op": "accept", "id": "<hex>", "ts": <epoch s>, "session_key": "...",
     "dedupe": "<dedupe key>"|null, "work": {UserWork fields, "route": {...}}}
    {"op": "start", "id": "...", "run_id": "...", "ts": ...}
    {"op": "tool",  "id": "...", "tool": "write", "ts": ...}
    {"op": "taint", "id": "...", "why": "web_fetch of https://...", "ts": ...}
    {"op": "reply", "id": "...", "ts": ..., "text": "<reply>", "key": "<idempotency key>",
     "stream": true}   # "stream" only for a streamed reply (text "" until it is final)
    {"op": "done",  "id": "...", "ts": ..., "outcome": "replied", ...}  # the outcome row
    {"op": "drop",  "id": "..."}   # a dead letter dropped or resubmitted
    {"op": "stop",  "id": "...", "ts": ...}  # an orderly shutdown cut the attempt off
    {"op": "local", "id": "...", "ts": ..., "session_key": "...", "channel": "openai",
     "agent": "main", "run_id": "..."}  # a CLI/webchat/API message accepted (no entry)

The ``done`` record carries the message's outcome (gateway/journal/outcomes.py); a
``start`` for an entry already started means the process died during the earlier attempt.
A ``local`` record (not fsynced: its caller is not acknowledged by it) is closed by its
outcome's ``done`` record (``"local": true``, same id); one still open at ``load`` is a
message whose caller the process died on (gateway/journal/local.py).
``load`` charges the death of the process that wrote the file to the attempts running in
it by the bystander rule (:func:`gateway.journal.outcomes.charged`): the charged ones add
their kind to ``crashes``; every one is closed (``settled``: it no longer runs). The
compacted ``start`` record carries both. An orderly shutdown (``stopped``) writes a
``stop`` record for each attempt it cut off: those are settled without a charge (the
operator stopped them; nothing the turn did), so restarts during a long turn never
dead-letter its message.

Compaction: once the file holds more than ``compact_after`` lines and at least four times
as many lines as the live (not done) entries need, the live records are written to a new
file which atomically replaces the old one. Each compaction costs O(live entries) and
happens at most once per ``compact_after`` appends, so the cost per message stays flat
however many messages the journal has seen. A torn or invalid line (a crash mid-write) is
skipped and logged; the next append starts on a fresh line.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gateway.journal.outcomes import KEPT, OutcomeRows, charged, crash_signature
from runtime.clock import Clock

log = structlog.get_logger(__name__)

FILE_NAME = "intake-journal.jsonl"
COMPACT_AFTER = 10_000  # lines
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


# fields still readable in a torn line (records are written compact, see _ENCODE)
@functools.cache  # compiled by the first unreadable line (issue 9, cold start)
def _field_re(name: str) -> re.Pattern[str]:
    """The JSON string field ``name`` of a (possibly torn) journal line."""
    return re.compile(rf'"{name}":"((?:[^"\\]|\\.)*)"')


@dataclass(slots=True)
class JournalEntry:
    """One accepted message and how far its turn got. ``tools``: side-effecting tools that
    began, in order; ``replying``: delivery of the reply began (its outcome is unknown
    until ``done``). Times are epoch seconds."""

    id: str
    session_key: str
    work: dict[str, Any]
    accepted_at: float
    dedupe: str | None = None
    run_id: str | None = None
    started: bool = False
    tools: list[str] = field(default_factory=list)
    replying: bool = False
    reply: dict[str, Any] | None = None  # {"text", "key", "ts"} of the reply being sent
    crashes: list[str] = field(default_factory=list)  # attempts a death was charged to
    attempt: list[str] = field(default_factory=list)  # tools of the current attempt
    # the current attempt ended with its process (accounted at a load): not running now
    settled: bool = False
    # what tainted its turn ("web_fetch of https://..."): a re-run after a restart starts
    # tainted, its context holding that content (docs/exec.md "Tainted turns")
    taint: list[str] = field(default_factory=list)

    def restart(self) -> None:
        """A new attempt begins: an earlier one not yet accounted (a journal written
        before deaths were accounted at load) ended with the process dying."""
        if self.started and not self.settled:
            self.crashes.append(crash_signature(self.attempt))
        self.attempt, self.settled = [], False

    def settle(self, charge: bool) -> None:
        """Its process died during the current attempt: close the attempt, counting it
        toward the dead letters when the death is ``charge``d to it."""
        if charge:
            self.crashes.append(crash_signature(self.attempt))
        self.attempt, self.settled = [], True

    def records(self) -> list[dict[str, Any]]:
        """The journal lines that rebuild this entry (used by compaction)."""
        out: list[dict[str, Any]] = [{"op": "accept", "id": self.id, "ts": self.accepted_at,
                                      "session_key": self.session_key, "dedupe": self.dedupe,
                                      "work": self.work}]
        if self.started:
            start: dict[str, Any] = {"op": "start", "id": self.id, "run_id": self.run_id}
            if self.crashes:
                start["crashes"] = self.crashes
            if self.settled:
                start["settled"] = True
            out.append(start)
        out += [{"op": "tool", "id": self.id, "tool": t} for t in self.tools]
        out += [{"op": "taint", "id": self.id, "why": w} for w in self.taint]
        if self.replying:
            out.append({"op": "reply", "id": self.id, **(self.reply or {})})
        return out


class IntakeJournal:
    """The journal file at ``path``. ``load()`` first (it opens the file for appending and
    returns the unfinished entries); one process owns the file (the state-dir lock).

    ``fsync=False`` skips the fsync (a kill -9 still loses nothing: written lines are in
    the kernel; only a power cut could). Raises OSError when the file cannot be written.
    """

    def __init__(self, path: Path, clock: Clock, *, fsync: bool = True,
                 compact_after: int = COMPACT_AFTER, kept: int = KEPT) -> None:
        self.path = Path(path)
        self.clock = clock
        self.fsync = fsync
        self.compact_after = max(1, compact_after)
        self._live: dict[str, JournalEntry] = {}
        self.outcomes = OutcomeRows(kept)  # outcome rows and dead letters
        self._by_run: dict[str, list[str]] = {}
        self._local: dict[str, JournalEntry] = {}  # local messages without an outcome yet
        self._fd: int | None = None
        self._lines = 0
        self._written = 0  # records written (sequence for group commit)
        self._synced = 0
        self._flush: asyncio.Future | None = None
        self.bytes_written = 0
        self.compactions = 0

    # -- opening -------------------------------------------------------------------------
    def load(self) -> list[JournalEntry]:
        """Read the file (skipping and logging torn lines), compact it, open it for
        appending. Returns the entries not ``done``, oldest first."""
        skipped: list[tuple[int, bytes]] = []
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raw = b""
        for lineno, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                self._apply(json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError):
                skipped.append((lineno, line))
        for lineno, line in skipped:
            self._log_skipped(lineno, line)
        if skipped:
            log.warning("journal_lines_skipped", path=str(self.path), count=len(skipped),
                        repair="torn or invalid lines ignored; the rest of the journal "
                               "is intact")
        self._account_death()
        self._compact()
        return self.unfinished()

    def _account_death(self) -> None:
        """The process that wrote the file ended (died, or stopped with turns cut off)
        while the attempts not yet settled ran: charge it by the bystander rule
        (:func:`gateway.journal.outcomes.charged`) and settle them all."""
        running = [e for e in self._live.values() if e.started and not e.settled]
        blamed = charged([(e.id, e.run_id or e.id,
                           None if e.replying else crash_signature(e.attempt))
                          for e in running])
        for e in running:
            e.settle(e.id in blamed)

    def _log_skipped(self, lineno: int, line: bytes) -> None:
        """One warning per unreadable line, naming its session key when the line still
        shows one (or its entry id is known), so the operator can look at that session."""
        text = line.decode("utf-8", "replace")
        key = _field_re("session_key").search(text)
        eid = _field_re("id").search(text)
        op = _field_re("op").search(text)
        session_key = key.group(1) if key else None
        if session_key is None and eid and eid.group(1) in self._live:
            session_key = self._live[eid.group(1)].session_key
        log.warning("journal_line_skipped", path=str(self.path), line=lineno,
                    session_key=session_key or "unknown",
                    entry_id=eid.group(1) if eid else None, op=op.group(1) if op else None,
                    bytes=len(line))

    def _apply(self, rec: dict[str, Any]) -> None:
        op, eid = rec["op"], str(rec["id"])
        if op == "accept":
            self._live[eid] = JournalEntry(
                id=eid, session_key=str(rec["session_key"]), work=dict(rec["work"]),
                accepted_at=float(rec.get("ts") or 0.0), dedupe=rec.get("dedupe"))
            return
        if op == "local":
            self._local[eid] = _local_entry(rec)
            return
        entry = self._live.get(eid)
        if entry is None:
            if op == "done":
                self._local.pop(eid, None)
            if op == "done" and rec.get("outcome"):
                self.outcomes.add(rec)  # a kept row (compacted) or a local message's
            elif op == "drop":
                self.outcomes.drop(eid)
            return  # else a mark for an entry compacted away (done) earlier
        if op == "start":
            entry.restart()
            entry.started, entry.run_id = True, rec.get("run_id")
            if rec.get("crashes"):
                entry.crashes = [str(c) for c in rec["crashes"]]
            entry.settled = bool(rec.get("settled"))
        elif op == "tool":
            entry.tools.append(str(rec["tool"]))
            if not entry.settled:  # (a compacted file lists a settled attempt's tools)
                entry.attempt.append(str(rec["tool"]))
        elif op == "taint":
            if str(rec["why"]) not in entry.taint:
                entry.taint.append(str(rec["why"]))
        elif op == "reply":
            entry.replying = True
            entry.reply = {k: rec[k] for k in ("text", "key", "ts", "stream") if k in rec}
        elif op == "stop":
            if entry.started and not entry.settled:
                entry.settle(False)
        elif op == "done":
            del self._live[eid]
            if rec.get("outcome"):
                self.outcomes.add({**self._row(entry), **rec})
        else:
            raise ValueError(f"unknown journal op {op!r}")

    # -- writing -------------------------------------------------------------------------
    def _write(self, records: list[dict[str, Any]]) -> None:
        if self._fd is None:
            raise RuntimeError("journal is not open (call load() first)")
        data = "".join(_ENCODE(r) + "\n" for r in records).encode()
        os.write(self._fd, data)
        self.bytes_written += len(data)
        self._lines += len(records)
        self._written += len(records)

    def accept(self, session_key: str, work: dict[str, Any],
               dedupe: str | None = None) -> JournalEntry:
        """Append a new entry (written, not yet durable: ``await durable()`` before the
        platform is acknowledged). Returns the entry; its ``id`` is 24 hex digits."""
        entry = JournalEntry(id=uuid.uuid4().hex[:24], session_key=session_key, work=work,
                             accepted_at=round(self.clock.time(), 3), dedupe=dedupe)
        self._write(entry.records())
        self._live[entry.id] = entry
        return entry

    async def durable(self) -> None:
        """Return once everything written so far is on disk (one fsync, in a thread, is
        shared by every caller that arrives while it runs)."""
        target = self._written
        while self.fsync and self._synced < target:
            if self._flush is None or self._flush.done():
                self._flush = asyncio.ensure_future(self._fsync())
            await asyncio.shield(self._flush)

    async def _fsync(self) -> None:
        upto, fd = self._written, self._fd
        if fd is not None:
            await asyncio.to_thread(os.fsync, fd)
        self._synced = max(self._synced, upto)
        self._maybe_compact()

    def started(self, entry_ids: list[str], run_id: str) -> None:
        """The turn ``run_id`` began for these entries (unknown ids are ignored)."""
        ids = [i for i in entry_ids if i in self._live]
        if not ids:
            return
        ts = round(self.clock.time(), 3)
        # A message steered into a running turn joins it: it shares the turn's fate from
        # here on, including the side-effecting tools that already began in this attempt
        # (not those of an attempt the process died in: they are not this turn's).
        known = self._by_run.get(run_id, [])
        ran = next((list(self._live[i].attempt) for i in known if i in self._live), [])
        records = [{"op": "start", "id": i, "run_id": run_id, "ts": ts} for i in ids]
        records += [{"op": "tool", "id": i, "tool": t, "ts": ts}
                    for i in ids if i not in known for t in ran]
        taint = next((list(self._live[i].taint) for i in known if i in self._live), [])
        records += [{"op": "taint", "id": i, "why": w, "ts": ts}
                    for i in ids if i not in known for w in taint]
        self._write(records)
        for i in ids:
            if i not in known:
                self._live[i].restart()
            self._live[i].started, self._live[i].run_id = True, run_id
            if i not in known:
                self._live[i].tools.extend(ran)
                self._live[i].attempt.extend(ran)
                self._live[i].taint.extend(w for w in taint if w not in self._live[i].taint)
        self._by_run[run_id] = [*known, *(i for i in ids if i not in known)]

    def tool_began(self, run_id: str, tool: str) -> None:
        """A side-effecting ``tool`` began in turn ``run_id`` (no-op for other runs)."""
        ids = [i for i in self._by_run.get(run_id, ()) if i in self._live]
        if ids:
            ts = round(self.clock.time(), 3)
            self._write([{"op": "tool", "id": i, "tool": tool, "ts": ts} for i in ids])
            for i in ids:
                self._live[i].tools.append(tool)
                self._live[i].attempt.append(tool)

    def tainted(self, run_id: str, why: str) -> None:
        """Untrusted content (``why``) reached turn ``run_id``: kept with its entries, so
        the turn re-run after a restart is tainted too (no-op for other runs, or when
        ``why`` is known already)."""
        ids = [i for i in self._by_run.get(run_id, ())
               if i in self._live and why not in self._live[i].taint]
        if ids:
            ts = round(self.clock.time(), 3)
            self._write([{"op": "taint", "id": i, "why": why, "ts": ts} for i in ids])
            for i in ids:
                self._live[i].taint.append(why)

    def replying(self, entry_ids: list[str], text: str = "", key: str | None = None, *,
                 stream: bool = False) -> None:
        """Delivery of the reply ``text`` (idempotency ``key``) to these entries begins;
        kept so that a crash mid-send can be resolved at the next start. ``stream``: the
        reply is streamed (written before its first piece is posted; ``text`` is "" until
        the final text is known)."""
        ids = [i for i in entry_ids if i in self._live]
        if ids:
            reply: dict[str, Any] = {"text": text, "key": key, "ts": round(self.clock.time(), 3)}
            if stream:
                reply["stream"] = stream  # True, or "draft": only drafts shown, none posted
            self._write([{"op": "reply", "id": i, **reply} for i in ids])
            for i in ids:
                self._live[i].replying, self._live[i].reply = True, reply

    def done(self, entry_id: str, outcome: dict[str, Any] | None = None) -> bool:
        """The entry is finished (reply delivered or parked in the outbox, or nothing to
        deliver). ``outcome``: its row (``{"outcome", "detail", ...}``, see
        gateway/journal/outcomes.py), kept for ``sessions outcomes``; ``work`` and
        ``crashes`` in it keep a dead letter. Unknown ids are ignored (False)."""
        entry = self._live.pop(entry_id, None)
        if entry is None:
            return False
        rec: dict[str, Any] = {"op": "done", "id": entry_id, "ts": round(self.clock.time(), 3)}
        if outcome:
            rec = {**self._row(entry), **outcome, **rec}
            self.outcomes.add(rec)
        self._write([rec])
        if entry.run_id is not None:
            ids = self._by_run.get(entry.run_id)
            if ids is not None and not any(i in self._live for i in ids):
                del self._by_run[entry.run_id]
        if self._flush is None or self._flush.done():
            self._maybe_compact()  # else after that fsync (it holds the current fd)
        return True

    @staticmethod
    def _row(entry: JournalEntry) -> dict[str, Any]:
        work = entry.work if isinstance(entry.work, dict) else {}
        return {"session_key": entry.session_key, "accepted_at": entry.accepted_at,
                "channel": work.get("channel"), "message_id": work.get("message_id"),
                "agent": work.get("agent_id")}

    def note_outcome(self, row: dict[str, Any]) -> str:
        """Record the outcome row of a message that has no entry (a local surface's, or a
        replica's whose entry is in PostgreSQL); it closes the ``local`` record of the
        same id. Returns the row's id."""
        rec = {"op": "done", "local": True, **row, "ts": round(self.clock.time(), 3)}
        rec["id"] = str(rec.get("id") or uuid.uuid4().hex[:24])
        self._local.pop(rec["id"], None)
        self.outcomes.add(rec)
        self._write([rec])
        return rec["id"]

    def accept_local(self, row: dict[str, Any]) -> str:
        """A message of the CLI, webchat or the OpenAI API was queued (``row``:
        ``{"session_key", "channel", "agent", "run_id"}``): written (not fsynced), so that
        a process death before its outcome is found at the next start. Returns its id, the
        id its outcome row must carry (:meth:`note_outcome`)."""
        rec = {"op": "local", "id": uuid.uuid4().hex[:24], "ts": round(self.clock.time(), 3),
               **{k: row.get(k) for k in _LOCAL_FIELDS}}
        self._write([rec])
        self._local[rec["id"]] = _local_entry(rec)
        return rec["id"]

    def local_settled(self, local_id: str) -> None:
        """Close the ``local`` record ``local_id`` whose outcome row went under another id
        (a replica's work row); no-op when it is closed already."""
        if self._local.pop(local_id, None) is not None:
            self._write([{"op": "done", "id": local_id, "ts": round(self.clock.time(), 3)}])

    def local_unfinished(self) -> list[JournalEntry]:
        """The accepted local messages without an outcome, oldest first (``work``:
        ``{"agent_id", "channel"}``, ``run_id`` set)."""
        return sorted(self._local.values(), key=lambda e: e.accepted_at)

    def drop_dead(self, entry_id: str) -> dict[str, Any] | None:
        """Forget the dead letter ``entry_id`` (dropped, or resubmitted as a new entry);
        its outcome row stays. Returns the dead letter, None for an unknown id."""
        dead = self.outcomes.drop(entry_id)
        if dead is not None:
            self._write([{"op": "drop", "id": entry_id, "ts": round(self.clock.time(), 3)}])
        return dead

    def stopped(self) -> list[str]:
        """Orderly shutdown, after the lanes drained: the attempts still open (started,
        not settled: turns the grace period cut off, replies being sent) were stopped by
        the operator, not by anything their turn did. Each gets a ``stop`` record (made
        durable now) so the next load settles it without charging it toward the dead
        letters. Returns their entry ids. Raises OSError when the file cannot be
        written."""
        running = [e for e in self._live.values() if e.started and not e.settled]
        if not running or self._fd is None:
            return []
        ts = round(self.clock.time(), 3)
        self._write([{"op": "stop", "id": e.id, "ts": ts} for e in running])
        for e in running:
            e.settle(False)
        if self.fsync:
            os.fsync(self._fd)
            self._synced = self._written
        return [e.id for e in running]

    # -- reading -------------------------------------------------------------------------
    def get(self, entry_id: str) -> JournalEntry | None:
        return self._live.get(entry_id)

    def unfinished(self) -> list[JournalEntry]:
        """Entries not ``done``, oldest first."""
        return sorted(self._live.values(), key=lambda e: e.accepted_at)

    def stats(self) -> dict[str, int]:
        """``{live, lines, bytes_written, compactions, outcomes, dead_letters}`` (lines =
        lines in the file now; outcomes = rows kept)."""
        return {"live": len(self._live), "lines": self._lines,
                "bytes_written": self.bytes_written, "compactions": self.compactions,
                "outcomes": len(self.outcomes), "dead_letters": len(self.outcomes.dead)}

    # -- compaction ----------------------------------------------------------------------
    def _maybe_compact(self) -> None:
        needed = sum(2 + len(e.tools) + len(e.taint) for e in self._live.values()) + \
            len(self.outcomes) + len(self._local)
        if self._lines > self.compact_after and self._lines > 4 * needed:
            self._compact()

    def _compact(self) -> None:
        """Rewrite the file with the live entries only (temp + fsync + rename + dir fsync)
        and reopen it for appending."""
        records = self.outcomes.records() + [r for e in self.unfinished() for r in e.records()]
        records += [_local_record(e) for e in self.local_unfinished()]
        data = "".join(_ENCODE(r) + "\n" for r in records).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        if self.fsync:
            _fsync_dir(self.path.parent)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.bytes_written += len(data)
        self._lines = len(records)
        self._synced = self._written
        self.compactions += 1

    def close(self) -> None:
        """Close the file (every line written is complete; nothing is lost)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_LOCAL_FIELDS = ("session_key", "channel", "agent", "run_id")


def _local_entry(rec: dict[str, Any]) -> JournalEntry:
    """The JournalEntry shape of a ``local`` record (never resumed: only its outcome)."""
    return JournalEntry(id=str(rec["id"]), session_key=str(rec.get("session_key") or ""),
                        work={"agent_id": rec.get("agent"), "channel": rec.get("channel")},
                        accepted_at=float(rec.get("ts") or 0.0), run_id=rec.get("run_id"))


def _local_record(entry: JournalEntry) -> dict[str, Any]:
    """The ``local`` record that rebuilds ``entry`` (compaction)."""
    return {"op": "local", "id": entry.id, "ts": entry.accepted_at,
            "session_key": entry.session_key, "channel": entry.work.get("channel"),
            "agent": entry.work.get("agent_id"), "run_id": entry.run_id}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
