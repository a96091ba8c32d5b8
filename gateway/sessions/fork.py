"""Fork and rewind a session (``/fork``, ``/rewind``, ``tidegate sessions fork|rewind``).

Transcripts are append-only and the timeline is irreversible, so neither operation edits
anything: both start a **new session id** whose transcript is a copy of the source
transcript's first N turns (its entries copied byte for byte; a new header that names the
source in ``forkedFrom``), and both are recorded in the timeline:

- on the source session: a SYSTEM_EVENT ``{"kind": "fork"|"rewind", "turn": N,
  "of_turns": T, "new_session_key"}`` (plus ``new_session_id`` for a fork under a new
  key; a switch records it before the source's SESSION_END, when the id does not exist
  yet);
- on the new session, after its SESSION_CREATE: a SYSTEM_EVENT ``{"kind": "forked_from",
  "session_id", "session_key", "turns": N, "entries": E}``.

``fork`` without ``switch`` puts the new session under a new key
``<key>:fork:<8 random hex>``; the source goes on unchanged.
``fork --switch`` and ``rewind`` put it under the same key: the source session ends
(SESSION_END, reason ``fork``/``rewind``) and its transcript keeps every later turn on
disk. A turn is a user message and everything up to the next one; ``at`` is a turn count
(``0`` .. T; empty = all) or an entry id (the turns up to and including the one holding
it). ``turn:N`` and ``id:X`` say which; a plain all-digit ``at`` is a turn count unless it
is no turn count as written (leading zeros, more than T) and an entry has that id.

Runs on the session's lane (never beside a running turn). Embedded storage only.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

import structlog

from runtime.clock import utc_iso
from runtime.fsutil import atomic_write
from runtime.storage.embedded.transcripts import FileTranscripts

log = structlog.get_logger(__name__)
TURN_PREFIX = "turn:"  # ``at`` = "turn:N": always a turn count
ID_PREFIX = "id:"  # ``at`` = "id:X": always an entry id (the control UI sends this form)


class ForkError(ValueError):
    """The fork or rewind cannot be done (the message says why, for the user)."""


@dataclass(slots=True)
class Cut:
    """The first ``turns`` of ``total`` turns of a transcript: its entry lines (bytes,
    newline-terminated, header excluded)."""

    lines: list[bytes]
    turns: int
    total: int


def _is_turn_start(entry: dict[str, Any]) -> bool:
    msg = entry.get("message")
    return entry.get("type") == "message" and isinstance(msg, dict) and \
        msg.get("role") == "user"


def cut_transcript(raw: bytes, at: str, kind: str = "fork") -> Cut:
    """The entries of the first turns of the transcript ``raw`` (JSONL bytes) up to
    ``at`` (see the module docstring; ``kind`` fork|rewind words the error). Torn or
    invalid lines are left out. Raises ForkError for an ``at`` beyond the transcript or
    an unknown entry id."""
    entries: list[tuple[bytes, dict[str, Any]]] = []
    for line in raw.split(b"\n"):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("type") != "session":
            entries.append((line + b"\n", obj))
    starts = [i for i, (_, e) in enumerate(entries) if _is_turn_start(e)]
    n, total = _turns_at(entries, starts, at.strip(), kind), len(starts)
    end = starts[n] if n < total else len(entries)
    return Cut([line for line, _ in entries[:end]], n, total)


def _turns_at(entries: list[tuple[bytes, dict[str, Any]]], starts: list[int], text: str,
              kind: str) -> int:
    """The turn count ``text`` names (see :func:`cut_transcript`). Raises ForkError."""
    total = len(starts)
    low = text.lower()
    if low.startswith(TURN_PREFIX):
        return _turn_count(text[len(TURN_PREFIX):].strip(), total, kind)
    if low.startswith(ID_PREFIX):
        return _entry_turns(entries, starts, text[len(ID_PREFIX):].strip())
    if not text:  # every turn: a copy of the whole session
        return total
    if text.isdigit():
        # an entry id made of digits ("00412345", "67176042") is no turn count as written
        as_turn = text == str(int(text)) and int(text) <= total
        if not as_turn and any(e.get("id") == text for _, e in entries):
            return _entry_turns(entries, starts, text)
        return _turn_count(text, total, kind)
    return _entry_turns(entries, starts, text)


def _turn_count(text: str, total: int, kind: str) -> int:
    if not text.isdigit():
        raise ForkError(f"{text!r} is no turn count (0 .. {total})")
    n = int(text)
    if n > total:
        verb = "rewind to" if kind == "rewind" else "fork at"
        raise ForkError(f"the session has {total} turn{'' if total == 1 else 's'}; cannot "
                        f"{verb} turn {n}")
    return n


def _entry_turns(entries: list[tuple[bytes, dict[str, Any]]], starts: list[int],
                 entry_id: str) -> int:
    idx = next((i for i, (_, e) in enumerate(entries) if e.get("id") == entry_id), None)
    if idx is None:
        raise ForkError(f"no entry {entry_id!r} in this session's transcript")
    return sum(1 for s in starts if s <= idx)


def _header(session_id: str, key: str, cwd: str | None, now: float,
            source: dict[str, Any]) -> bytes:
    header: dict[str, Any] = {"type": "session", "version": 3, "id": session_id,
                              "timestamp": utc_iso(now), "session_key": key}
    if cwd:
        header["cwd"] = cwd
    header["forkedFrom"] = source
    return json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


async def fork_session(executor: Any, agent: Any, key: str, at: str, *, switch: bool,
                       kind: str = "fork") -> tuple[Any, Cut]:
    """Fork (``kind`` "fork") or rewind (``kind`` "rewind", always ``switch``) session
    ``key`` at ``at``. Returns (the new session entry, the cut). Raises ForkError."""
    store = executor.logs.transcripts
    entry = agent.store.get(key)
    if entry is None:
        raise ForkError(f"no session {key}")
    if not isinstance(store, FileTranscripts):
        raise ForkError("fork and rewind need embedded storage (transcript files)")
    executor.logs.forget(entry.session_id)  # closes (flushes) its transcript writer
    await executor._settled(entry.session_id)
    try:
        raw = store.path(agent.id, entry.session_id).read_bytes()
    except FileNotFoundError:
        raw = b""
    cut = cut_transcript(raw, at or "", kind)
    hooks = executor.hooks
    record = getattr(hooks, "record", None)
    if switch:  # marked before the source's SESSION_END (nothing may follow that)
        _mark(record, entry, kind, cut, None, key)
        new = await executor.fresh_session(agent, key, reason=kind, route=entry.last_route)
        new_key = key
    else:
        new_key = f"{key}:fork:{secrets.token_hex(4)}"
        new = await agent.store.create(new_key, route=entry.last_route)
        await hooks.session_created(new)
        _mark(record, entry, kind, cut, new.session_id, new_key)
    source = {"sessionId": entry.session_id, "sessionKey": key, "turns": cut.turns}
    atomic_write(store.path(agent.id, new.session_id),
                 _header(new.session_id, new_key, str(agent.workspace), executor.clock.time(),
                         source) + b"".join(cut.lines))
    if record is not None:
        record(new.session_id, "SYSTEM_EVENT", {"kind": "forked_from",
                                                "session_id": entry.session_id,
                                                "session_key": key, "turns": cut.turns,
                                                "entries": len(cut.lines)})
    log.info(f"session_{kind}", session_key=key, session_id=entry.session_id,
             new_session_key=new_key, new_session_id=new.session_id, turns=cut.turns,
             of_turns=cut.total)
    return new, cut


def _mark(record: Any, entry: Any, kind: str, cut: Cut, new_sid: str | None,
          new_key: str) -> None:
    if record is None:
        return
    content = {"kind": kind, "turn": cut.turns, "of_turns": cut.total,
               "new_session_key": new_key}
    if new_sid is not None:
        content["new_session_id"] = new_sid
    record(entry.session_id, "SYSTEM_EVENT", content)


def fork_reply(kind: str, new: Any, cut: Cut, switch: bool) -> str:
    """The chat/CLI text after a fork or rewind."""
    what = "Rewound this session to" if kind == "rewind" else "Forked"
    where = (f"this chat goes on in a new session ({new.session_id})" if switch else
             f"the fork is session {new.session_key}")
    return (f"{what} turn {cut.turns} of {cut.total}: {where}; the previous transcript "
            "keeps every turn.")


async def fork_command(executor: Any, agent: Any, key: str, entry: Any,
                       work: Any) -> tuple[str, Any]:
    """``/fork [N|ID]``, ``/rewind N|ID`` (gateway/sessions/fork.py): the chat goes on in
    the new session; the control API adds ``--new-key`` for a fork beside it."""
    words = work.args.split()
    switch = work.command == "rewind" or "--new-key" not in words
    at = " ".join(w for w in words if w != "--new-key")
    if work.command == "rewind" and not at:
        return "Usage: /rewind N (the turn to go on from) or an entry id.", entry
    try:
        new, cut = await fork_session(executor, agent, key, at, switch=switch,
                                      kind=work.command)
    except ForkError as exc:
        return f"Cannot {work.command}: {exc}.", entry
    return fork_reply(work.command, new, cut, switch), new
