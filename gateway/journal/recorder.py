"""Recording the one outcome of every accepted message (docs/outcomes.md).

The turn executor knows how a user turn ended and records it (``record``); every lane
future is also watched (``watch``), so a message whose turn ended any other way (a bug
raised, ``/stop``, an ``interrupt`` message, a surface whose caller gave up) still gets
one. A message gets exactly one outcome: the first recorded wins, later ones are ignored.
Each outcome is

- its journal entry's ``done`` record (gateway/journal/outcomes.py), or a row of its own
  for a message that is not journaled (CLI, webchat, the OpenAI API);
- an ``OUTCOME`` timeline event of the session (``{"outcome", "detail", "message_id",
  "channel", "entry_id", "run_id"}``);
- one ``message_outcome`` log record with the session key;
- a count in ``/metrics`` (``tidegate_message_outcomes_total{outcome}``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import structlog

from gateway.journal.outcomes import OUTCOMES
from runtime.clock import Clock
from runtime.lanes import TurnInterrupted

log = structlog.get_logger(__name__)

FAILED_NOTICE = "Sorry — something went wrong on my side; the operator has been told."
_LEVEL = {"replied": "info", "silent": "info", "refused": "warning", "failed": "warning",
          "interrupted": "warning", "dead-lettered": "error"}


def outcome_of(result: Any) -> tuple[str, str]:
    """``(outcome, detail)`` of a lane result that nobody recorded: a TurnResult by its
    status, a TurnInterrupted, or anything else (a command's result)."""
    if isinstance(result, TurnInterrupted):
        return "interrupted", result.reason
    status = str(getattr(result, "status", "ok"))
    error = str(getattr(result, "error", "") or "")
    if status == "refused":
        return "refused", error
    if status in ("error", "timeout"):
        return "failed", error or status
    if status == "aborted":
        return "interrupted", "stopped"
    return ("replied", "") if str(getattr(result, "text", "")).strip() else ("silent", "")


def turn_outcome(result: Any, delivery: str, *, local: bool, resume: str | None = None,
                 tools: list[str] | tuple[str, ...] = ()) -> tuple[str, str]:
    """``(outcome, detail)`` of a user turn that ended with ``result`` (TurnResult) and
    ``delivery`` (what ``LiveReply.finish`` returned, ``tool``: the message tool reached
    the chat, ``none``: nothing was delivered). ``local``: the caller takes the reply
    (CLI, webchat, the OpenAI API). ``resume``/``tools``: a turn resumed after a restart
    (``continue``: side-effecting ``tools`` had run before it)."""
    from channels.outbound.silent import silent_reply
    status = str(result.status)
    calls = getattr(result, "client_calls", None)
    if status == "ok" and calls:
        return "replied", "asked the client to run " + ", ".join(c.name for c in calls)
    if status == "refused":
        out = ("refused", str(result.error or result.text))
    elif status in ("error", "timeout"):
        out = ("failed", str(result.error or status))
    elif delivery == "tool":
        out = ("replied", "sent with the message tool")
    elif delivery == "silent" or (delivery == "none" and local
                                  and silent_reply(result.text).silent):
        out = ("silent", "")
    elif delivery == "none":
        out = ("replied", "") if local and result.text.strip() else ("silent", "empty reply")
    elif delivery.startswith("failed"):
        out = ("failed", f"the reply was not delivered ({delivery[8:]})")
    else:
        out = ("replied", "" if delivery in ("delivered", "streamed") else delivery)
    if resume == "continue":
        ran = ", ".join(dict.fromkeys(tools)) or "tools"
        return "interrupted", (f"a restart interrupted the turn after {ran} had run; it "
                               f"continued from the transcript and ended {out[0]}"
                               + (f" ({out[1]})" if out[1] else ""))
    if resume == "rerun":
        return out[0], "re-run after a restart" + (f"; {out[1]}" if out[1] else "")
    return out


class OutcomeRecorder:
    """``journal``: the IntakeJournal (None: unreadable; outcomes still reach the timeline
    and the log); ``timeline``: TimelineHooks or None; ``session_id_of(agent, key)``: the
    session's current id or None; ``notify(route, text, key)``: an async send of a notice
    (a message whose turn raised gets one)."""

    def __init__(self, clock: Clock, journal: Any = None, timeline: Any = None,
                 session_id_of: Callable[[str, str], str | None] | None = None,
                 notify: Callable[..., Any] | None = None) -> None:
        self.clock = clock
        self.journal = journal
        self.timeline = timeline
        self.session_id_of = session_id_of or (lambda agent, key: None)
        self.notify = notify
        self.counts: Counter[str] = Counter()
        self.on_outcome: list[Callable[[str], None]] = []  # metrics
        self.shared = False  # replicas: `sessions outcomes` reads the shared timeline
        # secrets out of the stored detail (a provider's 401 may quote the key): the log
        # redactor's, given the gateway's secrets by open_outcomes
        self.redact: Callable[[str], str] = _process_redact
        self._tasks: set[asyncio.Task] = set()
        # journal entry id -> lane futures not settled yet: the message waits in its lane's
        # queue or its turn runs (not lost, however long it waits behind a long turn)
        self._in_lane: Counter[str] = Counter()

    def record(self, works: list[Any], outcome: str, detail: str = "", *, session_key: str,
               session_id: str | None = None) -> None:
        """The messages ``works`` (UserWork) ended in ``outcome`` (one of OUTCOMES).
        Raises ValueError for an unknown outcome; a work already recorded is skipped."""
        for work in works:
            if getattr(work, "outcome", None) is not None:
                continue
            work.outcome = outcome
            self.record_message(
                {"channel": work.channel, "message_id": work.message_id,
                 "agent": work.agent_id, "accepted_at": work.received_at,
                 "journal_id": work.journal_id, "run_id": work.run_id,
                 "album_parts": list(getattr(work, "album_parts", ())),
                 "album_messages": list(getattr(work, "album_messages", ())),
                 "local_id": getattr(work, "local_id", None)},
                outcome, detail, session_key=session_key, session_id=session_id)

    def record_turn(self, works: list[Any], result: Any, delivery: str, *, session_key: str,
                    session_id: str | None = None) -> None:
        """Record the outcome of the user turn that answered ``works`` (see
        :func:`turn_outcome`; a resumed turn's tools come from its journal entry)."""
        first = works[0]
        entry = self.journal.get(first.journal_id) if self.journal is not None \
            and first.journal_id else None
        outcome, detail = turn_outcome(result, delivery, local=first.route is None,
                                       resume=first.resume,
                                       tools=list(entry.tools) if entry else [])
        self.record(works, outcome, detail, session_key=session_key, session_id=session_id)

    def record_message(self, msg: dict[str, Any], outcome: str, detail: str = "", *,
                       session_key: str, session_id: str | None = None) -> str | None:
        """Record the outcome of one message given as ``{"channel", "message_id",
        "agent", "accepted_at", "journal_id", "run_id", "album_parts", "album_messages",
        "local_id"}`` (all optional; ``work`` and ``crashes`` keep a dead letter;
        ``album_messages``: the message ids of ``album_parts``; ``local_id``: the
        message's ``local`` journal record, closed by this row): an intake refusal before
        any turn, or a journal entry resumed at start. The other parts (an album's, or
        the messages of a merged turn resumed after a crash) get a row and an ``OUTCOME``
        event each, with their own message id. Returns the row's id (None without a
        journal). Raises ValueError for an unknown outcome."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r} (have: {', '.join(OUTCOMES)})")
        # redacted before it is cut: a cut secret would no longer be recognised
        row = {"outcome": outcome, "detail": self.redact(detail or "")[:500],
               "session_key": session_key, "channel": msg.get("channel"),
               "message_id": msg.get("message_id"), "agent": msg.get("agent")}
        parts = _parts(msg)
        if self.journal is not None:
            parts = self._journal_rows(msg, row, parts)
        sid = session_id or (self.session_id_of(str(msg.get("agent")), session_key)
                             if msg.get("agent") else None)
        for entry_id, message_id in parts:
            if self.timeline is not None and sid:
                # a write of its own, now: held for the session's next write it would be
                # lost to a kill -9 before that (and unseen by readers meanwhile)
                self.timeline.record(sid, "OUTCOME", {
                    "outcome": outcome, "detail": row["detail"], "message_id": message_id,
                    "channel": row["channel"], "entry_id": entry_id,
                    "run_id": msg.get("run_id")})
            self.counts[outcome] += 1
            for hook in self.on_outcome:
                hook(outcome)
            getattr(log, _LEVEL[outcome])("message_outcome", session_key=session_key,
                                          outcome=outcome, detail=row["detail"] or None,
                                          channel=row["channel"], message_id=message_id,
                                          entry_id=entry_id, run_id=msg.get("run_id"))
        return parts[0][0]

    def _journal_rows(self, msg: dict[str, Any], row: dict[str, Any],
                      parts: list[tuple[str | None, Any]]) -> list[tuple[str | None, Any]]:
        """Write the outcome rows of ``parts`` (``(entry id, message id)``): the ``done``
        of each journal entry, else (not this file's entries: replicas' work rows, a
        local message) a row of its own for each. Returns ``(row id, message id)``."""
        journal = self.journal
        extra = {k: msg[k] for k in ("work", "crashes") if k in msg}
        done = [(i, mid) for i, mid in parts
                if i and journal.done(i, {**row, **extra, "message_id": mid})]
        if not done:
            # a dead letter keeps its message; a local message closes its record
            targets = [(i, mid) for i, mid in parts if i] or \
                [(msg.get("local_id"), row["message_id"])]
            done = [(journal.note_outcome({**row, **extra, "message_id": mid, "id": i,
                                           "accepted_at": msg.get("accepted_at")}), mid)
                    for i, mid in targets]
        if msg.get("local_id"):  # its row went under a work row's id (replicas)
            journal.local_settled(str(msg["local_id"]))
        return done

    def accept_local(self, work: Any, session_key: str) -> None:
        """``work`` (a UserWork of the CLI, webchat or the OpenAI API) was queued: its
        ``local`` journal record (``work.local_id``), so that a process death before its
        outcome still ends it in one (gateway/journal/local.py). A journal that cannot be
        written is logged; the message runs on."""
        if self.journal is None:
            return
        try:
            work.local_id = self.journal.accept_local(
                {"session_key": session_key, "channel": work.channel,
                 "agent": work.agent_id, "run_id": work.run_id})
        except (OSError, RuntimeError) as exc:
            log.error("journal_write_failed", session_key=session_key, error=str(exc),
                      effect="a crash before this message's outcome leaves it without one")

    def watch(self, work: Any, session_key: str, fut: asyncio.Future) -> None:
        """Record ``work``'s outcome from its lane future when nothing recorded it first.
        A cancelled future (shutdown) leaves a journaled message for the next start; a
        local one (its caller gets an error) is ``failed``."""
        def settled(f: asyncio.Future) -> None:
            if getattr(work, "outcome", None) is not None:
                if getattr(work, "local_id", None) and self.journal is not None:
                    # forwarded: the replica that ran it records its outcome
                    self.journal.local_settled(work.local_id)
                return
            if f.cancelled():
                if not work.journal_id:
                    self.record([work], "failed", "the gateway stopped",
                                session_key=session_key)
                return
            exc = f.exception()
            if exc is not None:
                self.record([work], "failed", f"{type(exc).__name__}: {exc}",
                            session_key=session_key)
                self._notice(work, session_key, exc)
                return
            outcome, detail = outcome_of(f.result())
            self.record([work], outcome, detail, session_key=session_key,
                        session_id=getattr(f.result(), "session_id", None) or None)

        fut.add_done_callback(settled)
        self._hold(work, fut)

    def _hold(self, work: Any, fut: asyncio.Future) -> None:
        """``work``'s journal entries (an album's parts too) are in a lane until ``fut``
        settles; released after ``settled`` above has recorded the outcome (done
        callbacks run in the order they were added)."""
        ids = [str(i) for i in (getattr(work, "journal_id", None),
                                getattr(work, "local_id", None),  # a local message's record
                                *getattr(work, "album_parts", ())) if i]
        if not ids:
            return
        self._in_lane.update(ids)

        def release(_f: asyncio.Future) -> None:
            self._in_lane.subtract(ids)
            for i in ids:
                if self._in_lane[i] <= 0:
                    del self._in_lane[i]

        fut.add_done_callback(release)

    def _notice(self, work: Any, key: str, exc: BaseException) -> None:
        """The failure notice to ``work``'s chat, once per turn: the lane settles every
        message of a turn (merged, steered in) with the one exception the turn raised."""
        if self.notify is None or work.route is None:
            return
        told = getattr(exc, "_tidegate_told", None)
        if told is None:
            told = set()
            try:
                exc._tidegate_told = told  # type: ignore[attr-defined]
            except AttributeError:  # an exception type without attributes: no dedupe
                pass
        where = (work.route.channel, work.route.account, work.route.to, work.route.thread)
        if where in told:
            return
        told.add(where)
        task = asyncio.ensure_future(self.notify(work.route, FAILED_NOTICE, key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def unresolved(self, timeout_of: Callable[[Any], float]) -> int:
        """Accepted messages with no outcome yet, older than their turn timeout
        (``timeout_of(entry)`` seconds), that no lane holds: journaled platform messages
        and the local ones (CLI, webchat, the OpenAI API). A message waiting in its lane's
        queue (behind a long turn) or in a running turn is on its way, not lost. Held
        album parts waiting for a mention are not accepted yet and do not count. A bug
        when not 0."""
        if self.journal is None:
            return 0
        now = self.clock.time()
        return sum(1 for e in [*self.journal.unfinished(), *self.journal.local_unfinished()]
                   if not (isinstance(e.work, dict) and isinstance(e.work.get("gated"), dict))
                   and e.id not in self._in_lane
                   and now - e.accepted_at > timeout_of(e))


def _parts(msg: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """``(entry id, message id)`` of each message an outcome is for: the message itself,
    then the other parts merged into its turn (``album_parts`` with ``album_messages``;
    a part without a known id of its own shows the first one's)."""
    first = msg.get("journal_id")
    mids = list(msg.get("album_messages") or ())
    rest = [(str(i), mids[n] if n < len(mids) and mids[n] is not None
             else msg.get("message_id"))
            for n, i in enumerate(msg.get("album_parts") or ()) if i]
    return [(str(first) if first else None, msg.get("message_id")), *rest]


def open_outcomes(gw: Any) -> OutcomeRecorder:
    """The gateway's recorder (``gw`` offers clock, timeline_hooks, agents, deliverer,
    intake, executor), given to the intake and the turn executor. Its journal is set once
    the journal has loaded."""
    def session_id_of(agent_id: str, key: str) -> str | None:
        agent = gw.agents.get(agent_id)
        entry = agent.store.get(key) if agent is not None else None
        return entry.session_id if entry is not None else None

    async def notify(route: Any, text: str, key: str) -> None:
        await gw.deliverer.send(route, text, kind="notice", session_key=key)

    rec = OutcomeRecorder(gw.clock, timeline=gw.timeline_hooks, session_id_of=session_id_of,
                          notify=notify)
    rec.redact = lambda text: _gateway_redact(gw, text)
    gw.intake.outcomes = gw.executor.outcomes = rec
    return rec


def _process_redact(text: str) -> str:
    from gateway.logs.pipeline import redact
    return redact(text)


def _gateway_redact(gw: Any, text: str) -> str:
    """``text`` without the secrets of ``gw``'s config and of the gateway itself (its
    control token, the DSN's password) nor the log redactor's (token shapes, the env
    file's secrets): what the log shows, applied before an outcome is stored."""
    if len(text) < 5:
        return text
    from gateway.config.secrets import runtime_secrets
    from gateway.logs.redact import Redactor, config_secrets
    secrets = set(config_secrets(gw.loaded)) | set(runtime_secrets(gw).values())
    return _process_redact(Redactor(secrets).redact(text))


def turn_timeout_of(gw: Any) -> Callable[[Any], float]:
    """``entry -> seconds``: the turn timeout of the journal entry's agent (600 s when
    the agent is gone)."""
    def timeout_of(entry: Any) -> float:
        agent = gw.agents.get((entry.work or {}).get("agent_id")) \
            if isinstance(entry.work, dict) else None
        return float(agent.settings.timeout) if agent is not None else 600.0
    return timeout_of


def outcome_status(gw: Any) -> dict[str, Any]:
    """The ``outcomes`` section of ``status``: ``{"unresolved", "counts", "dead_letters",
    "dead_letters_recent"}`` (unresolved: accepted messages without an outcome older than
    their turn timeout; a bug when not 0)."""
    from gateway.journal.dead_letters import listing
    rec = gw.outcomes
    dead = listing(gw.journal) if rec.journal is not None else []
    return {"unresolved": rec.unresolved(turn_timeout_of(gw)), "counts": dict(rec.counts),
            "dead_letters": len(dead),
            "dead_letters_recent": [{k: d.get(k) for k in ("id", "session_key", "ts",
                                                          "detail")} for d in dead[-10:]]}
