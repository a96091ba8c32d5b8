"""The lane runner: executes one lane batch (user messages, a command, or a synthetic
turn) for a session key — resolving the session (reset policy, creation), draining system
events, running the one turn implementation and delivering the reply (DESIGN.md steps 4-8).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from gateway.agents import Agent
from gateway.journal.resume import answered_in_transcript, logged_messages
from gateway.outbound.delivery import Deliverer
from gateway.outbound.replies import ReplyFlow
from gateway.sessions.entry import SessionEntry, reset_due
from gateway.sessions.identity import SessionExists
from gateway.sessions.logs import SessionLogs
from gateway.turns.attribution import attributed
from gateway.turns.commands import THINK_APIS
from gateway.turns.session_commands import run_command
from gateway.turns.work import CommandWork, SyntheticWork, UserWork, transcript_id
from runtime.clock import Clock
from runtime.context.session_log import HeldLog
from runtime.lanes import TurnControl
from runtime.providers.base import ToolSpec
from runtime.storage.sessions import SessionStoreError
from runtime.tools.policy import ToolScope
from runtime.turn import TurnInput, TurnResult, UserText
from runtime.turn.types import LANE_GONE

log = structlog.get_logger(__name__)


class SessionHooks(Protocol):
    """Lifecycle hooks (the timeline implements them)."""

    async def session_created(self, entry: SessionEntry) -> None: ...
    async def session_ended(self, entry: SessionEntry, reason: str) -> None: ...


class NullHooks:
    async def session_created(self, entry: SessionEntry) -> None:
        return None

    async def session_ended(self, entry: SessionEntry, reason: str) -> None:
        return None


class TurnExecutor:
    """Callable given to the LaneManager: ``await executor(key, payloads, control)``."""

    def __init__(self, *, agents: dict[str, Agent], logs: SessionLogs, clock: Clock,
                 deliverer: Deliverer, reset: Any, hooks: SessionHooks | None = None,
                 drain_events: Callable[[str, str, str], tuple[str, list[str]]]
                 | None = None,
                 replies: ReplyFlow | None = None,
                 known_models: Callable[[], list[str]] | None = None) -> None:
        self.agents = agents
        self.logs = logs
        self.clock = clock
        self.deliverer = deliverer
        self.reset = reset
        self.hooks = hooks or NullHooks()
        self.drain_events = drain_events
        self.events_arriving: Any = None  # async (key): replicas: wait for handed-over events
        self.routes: dict[str, Any] = {}  # session key -> route of its latest user turn
        self.journal: Any = None  # gateway/journal/tracking.py JournalTracker, when enabled
        # replicas: key -> whether its lane is still run here (bool or awaitable), asked
        # before each model round (gateway/cluster/work.py runs_lane)
        self.lane_held: Callable[[str], Any] | None = None
        self.outcomes: Any = None  # gateway/journal/recorder.py OutcomeRecorder
        self.replies = replies or ReplyFlow(deliverer=deliverer, settings=lambda c, a: None)
        self.known_models = known_models or list
        # (agent id, channel, sender id) -> why that sender's message taints the turn, or
        # None (gateway/approvals/service.py ``Approvals.sender_taint``)
        self.sender_taint: Callable[[str, str, str | None], str | None] | None = None
        # (agent id, channel, sender id) -> that sender's canonical id when not an owner
        # (the sandbox: docs/exec.md), or None (gateway/approvals/service.py ``stranger``)
        self.stranger_of: Callable[[str, str, str | None], str | None] | None = None
        self.memory: Any = None  # gateway/memory/hub.py MemoryHub (per-sender memory)
        # () -> gateway/outbound/media.py OutboundFiles: a file holding a secret is not
        # attached to a reply
        self.outbound_files: Callable[[], Any] = lambda: None

    async def __call__(self, key: str, payloads: list[Any], control: TurnControl) -> Any:
        first = payloads[0]
        self.deliverer.tool_targets.pop(key, None)  # message-tool targets of this turn
        try:
            if isinstance(first, CommandWork):
                return await run_command(self, key, first)
            if isinstance(first, SyntheticWork):
                return await self._synthetic(key, first, control)
            return await self._user_turn(key, payloads, control)
        except SessionStoreError as exc:  # this agent is out of service, nothing else
            return await self._out_of_service(key, payloads, exc)

    async def _out_of_service(self, key: str, payloads: list[Any],
                              exc: SessionStoreError) -> TurnResult:
        log.warning("turn_refused_store_unavailable", session_key=key, path=exc.path,
                    error=exc.reason)
        first = payloads[0]
        text = ("(This agent is out of service: its session store cannot be read. "
                "The operator has been told; see `tidegate status`.)")
        route = getattr(payloads[-1], "route", None)
        if route is not None and not isinstance(first, SyntheticWork):
            await self.deliverer.send(route, text, kind="notice", session_key=key)
        return TurnResult(getattr(first, "run_id", ""), key, "", "error", text,
                          error=str(exc))

    async def _settled(self, session_id: str) -> None:
        """Wait until the session's recorded events are committed (timeline hooks)."""
        await self.logs.settled(session_id)  # transcript lines (PostgreSQL: queued)
        settled = getattr(self.hooks, "settled", None)
        if settled is not None:
            await settled(session_id)

    # -- sessions ------------------------------------------------------------------------
    async def ensure_session(self, agent: Agent, key: str, *, activity: bool,
                             chat_type: str | None = None,
                             display_name: str | None = None) -> SessionEntry:
        """The current session of ``key``, rolled per the reset policy (user activity only)
        or created."""
        entry = agent.store.get(key)
        if entry is not None and activity:
            why = reset_due(entry, mode=self.reset.mode, now=self.clock.time(),
                            at_hour=self.reset.at_hour, idle_minutes=self.reset.idle_minutes,
                            tz=agent.settings.user_timezone)
            if why:
                log.info("session_reset", session_key=key, reason=why,
                         old_session_id=entry.session_id)
                await self.end_session(agent, entry, why)
                entry = None
        if entry is None:
            try:
                entry = await agent.store.create(key, chat_type=chat_type,
                                                 display_name=display_name)
            except SessionExists as exc:  # replicas: created elsewhere meanwhile
                return exc.entry
            log.info("session_created", session_key=key, session_id=entry.session_id,
                     agent=agent.id)
            await self.hooks.session_created(entry)
        return entry

    async def fresh_session(self, agent: Agent, key: str, *, reason: str,
                            route: dict[str, Any] | None = None) -> SessionEntry:
        """End ``key``'s current session (its transcript stays on disk) and start a new
        session id under the same key."""
        old = agent.store.get(key)
        if old is not None:
            await self.end_session(agent, old, reason)
        try:
            entry = await agent.store.create(key, route=route)
        except SessionExists as exc:  # replicas: a newer session elsewhere: that one
            return exc.entry
        await self.hooks.session_created(entry)
        log.info("session_created", session_key=key, session_id=entry.session_id,
                 reason=reason, old_session_id=old.session_id if old else None)
        return entry

    async def end_session(self, agent: Agent, entry: SessionEntry, reason: str) -> None:
        await self.hooks.session_ended(entry, reason)
        self.logs.forget(entry.session_id)

    async def _log_for(self, agent: Agent, entry: SessionEntry):
        slog = self.logs.get(agent.id, entry.session_id, entry.session_key,
                             max_tokens=agent.settings.context_tokens * 3 // 2,
                             cwd=str(agent.workspace))
        await slog.preload()  # the first load of a session never blocks the loop
        return slog

    def _events(self, key: str, agent: Agent, entry: SessionEntry) -> tuple[str, list[str]]:
        """Drain the session's system events (exactly once, at the start of the turn):
        ``(their prompt section, what they taint the turn with)``."""
        if self.drain_events is None:
            return "", []
        return self.drain_events(key, agent.settings.user_timezone, entry.session_id)

    # -- user turns ----------------------------------------------------------------------
    async def _user_turn(self, key: str, works: list[UserWork],
                         control: TurnControl) -> TurnResult:
        last = works[-1]
        if self.journal is not None:
            marked = self.journal.turn_started(works[0].run_id, works)
            # replicas: committed before the transcript line; a result instead of None
            # says the rows run on another replica (taken over), which answers them: the
            # turn ends before it touches the session (no session row, no transcript
            # cached here for a lane this replica does not run)
            elsewhere = await marked if marked is not None else None
            if elsewhere is not None:
                for w in works:
                    w.outcome = "forwarded"  # the replica that runs them records it
                return elsewhere
        agent = self.agents[last.agent_id]
        entry = await self.ensure_session(agent, key, activity=True, chat_type=last.chat_type,
                                          display_name=last.sender_name)
        slog = await self._log_for(agent, entry)
        if self.events_arriving is not None:  # system events handed over just before
            await self.events_arriving(key)
        if last.route is not None:
            self.routes[key] = last.route  # the message tool's "this conversation"
        steered: list[UserWork] = []  # messages steered into this turn while it runs

        def take_steered(w: UserWork) -> UserText:
            steered.append(w)  # journaled as this turn's: its reply and done cover them
            if self.journal is not None:
                self.journal.turn_started(works[0].run_id, [w])
            return _user_text(w, _logged(w, slog))
        # a message of only client-tool results has no text of its own
        logged, answer = await _resumed(works, slog, key)
        messages = [_user_text(w, id(w) in logged) for w in works
                    if w.text or not w.tool_results]
        asker = self.memory.asker_for(agent.id, last) if self.memory is not None else None
        stranger = self._stranger(agent.id, works)
        notes = await self.memory.prompt_notes(agent.id, asker) if asker is not None else ""
        history = await self._thread_history(key, entry, works)
        events, event_taint = self._events(key, agent, entry)
        if history and messages:  # the thread so far, in front of the session's first message
            messages[0].text = f"{history}\n\n{messages[0].text}"
        inp = TurnInput(
            session_key=key, session_id=entry.session_id, run_id=works[0].run_id,
            messages=messages, trigger="user",
            system_events=events, event_taint=event_taint,
            session_started_at=entry.created_at,
            last_user_at=entry.last_active_at,
            environment={"Channel": last.channel, "Chat type": last.chat_type,
                         "Session key": key},  # no sender: a user-chosen name (user role)
            steer_text=take_steered, stream=any(w.stream for w in works),
            tool_scope=user_scope(agent, last, asker, stranger),
            guidance=self.replies.guidance(last),
            memory=notes,
            model=entry.model_override,
            reasoning=entry.think if agent.api in THINK_APIS else None,
            tainted_by=self._tainted_by(agent.id, works),
            stranger=stranger,
            client_tools=[ToolSpec(t["name"], t.get("description") or "",
                                   t.get("parameters") or {"type": "object", "properties": {}})
                          for w in works for t in w.client_tools],
            tool_results=[r for w in works for r in w.tool_results],
            lane_held=self._lane_check(key))
        # may return an awaitable (replicas: the mark is durable in PostgreSQL first)
        sending = (lambda text, stream=False: self.journal.reply_sending(
            works + steered, text, works[0].journal_id, stream=stream)) if self.journal else None
        live = self.replies.open(last, key, on_sending=sending,
                                 idempotency_key=works[0].journal_id, verbose=entry.verbose)
        if answer is not None:  # finished before a crash
            log.info("turn_already_answered", session_key=key, run_id=inp.run_id,
                     resume=last.resume, messages=len(works))
            result = TurnResult(inp.run_id, key, entry.session_id, "ok", answer)
        else:
            async with self.deliverer.typing(last.route), \
                    live.running(agent.runner.bus, inp.run_id):
                result = await agent.runner.run(inp, slog, control=control)
        if result.error_class == LANE_GONE:  # another replica took the lane: it answers
            return await self._lane_gone(live, works + steered)
        await self._settled(entry.session_id)  # the reply never outruns the turn's record
        agent.store.touch(key, activity=True,
                          route=last.route.as_dict() if last.route else None,
                          counters={"turns": 1, "messages_in": len(works),
                                    "tool_calls": result.tool_calls,
                                    "input_tokens": result.usage.input_tokens,
                                    "output_tokens": result.usage.output_tokens})
        log.info("turn_done", session_key=key, run_id=result.run_id, status=result.status,
                 duration_ms=round(result.duration_ms, 2), model_ms=round(result.model_ms, 2),
                 tool_calls=result.tool_calls, agent=agent.id)
        # a chat turn that messaged its own chat has answered there; a final reply that
        # attaches files (MEDIA: lines) still brings something new and goes out
        reached = last.route is not None and result.text.strip() != "" and \
            self.deliverer.reached_by_tool(key, last.route, result.text,
                                           any_text="MEDIA:" not in result.text)
        if last.route is not None and result.text.strip() and not reached:
            delivery = "queued"  # cut off by shutdown: parked in the outbox
            try:
                delivery = await live.finish(result, workspace=agent.workspace,
                                             files=self.outbound_files())
            finally:  # delivered, or parked in the outbox (also when cut off by shutdown)
                self._outcome(key, entry.session_id, works + steered, result, delivery)
                if self.journal is not None:
                    self.journal.finished(works + steered)
        else:
            await live.finish(None)  # nothing to deliver: a streamed draft is removed
            self._outcome(key, entry.session_id, works + steered, result,
                          "tool" if reached else "none")
        return result

    def _lane_check(self, key: str) -> Callable[[], Any] | None:
        """TurnInput ``lane_held`` of a turn of ``key`` (user or synthetic): () -> whether
        its lane is still run here (bool or awaitable); None off replicas."""
        return (lambda: self.lane_held(key)) if self.lane_held else None

    @staticmethod
    async def _lane_gone(live: Any, works: list[UserWork]) -> Any:
        """The turn ended before a model call: its session's lane (and rows) moved to
        another replica while this one was paused, and that replica answers the messages
        and records their outcome. Returns the lane result of forwarded work."""
        from gateway.cluster.journal import Forwarded  # only replicas end turns this way
        await live.finish(None)  # a streamed draft is removed; nothing is sent
        for w in works:
            w.outcome = "forwarded"
        return Forwarded("another replica")

    def _outcome(self, key: str, session_id: str, works: list[UserWork], result: TurnResult,
                 delivery: str) -> None:
        """Record the messages' outcome (gateway/journal/recorder.py)."""
        if self.outcomes is not None:
            self.outcomes.record_turn(works, result, delivery, session_key=key,
                                      session_id=session_id)

    async def _thread_history(self, key: str, entry: SessionEntry,
                              works: list[UserWork]) -> str:
        """A thread session's first turn: the thread so far from the platform (issue 8
        item 8; ``channels.inbound.thread_history``), "" otherwise."""
        route = works[-1].route
        if route is None or not route.thread or ":thread:" not in key \
                or entry.counters.get("turns"):
            return ""
        fetch = getattr(self.deliverer.find(route.channel, route.account), "thread_history",
                        None)
        if fetch is None:
            return ""
        try:
            return await fetch(route.to, route.thread, before=works[0].message_id)
        except Exception:  # context only: the turn runs without it
            log.exception("thread_history_failed", session_key=key)
            return ""

    # -- synthetic turns -----------------------------------------------------------------
    async def _synthetic(self, key: str, work: SyntheticWork,
                         control: TurnControl) -> TurnResult:
        agent = self.agents[work.agent_id]
        if work.fresh_session:
            entry = await self.fresh_session(agent, key, reason=work.trigger)
        else:
            entry = await self.ensure_session(agent, key, activity=False)
        slog = await self._log_for(agent, entry)
        sink = HeldLog(slog) if work.hold else slog
        events, event_taint = self._events(key, agent, entry)
        inp = TurnInput(session_key=key, session_id=entry.session_id, run_id=work.run_id,
                        trigger=work.trigger, prompt=work.prompt, model=work.model,
                        system_events=events, event_taint=event_taint,
                        session_started_at=entry.created_at, last_user_at=entry.last_active_at,
                        environment={"Session key": key, "Trigger": work.trigger,
                                     **work.environment},
                        timeout=work.timeout, tool_scope=work.tool_scope,
                        tainted_by=list(work.tainted_by),
                        stranger=getattr(work.tool_scope, "stranger", None),
                        lane_held=self._lane_check(key))
        try:
            result = await agent.runner.run(inp, sink, control=control)
        except BaseException:
            if isinstance(sink, HeldLog):
                sink.commit()  # an aborted beat keeps what it did: nothing is lost silently
            raise
        if result.error_class == LANE_GONE:  # another replica runs the session now
            return _synthetic_lane_gone(key, work, sink, result)
        keep = work.decide(result) if work.decide else True
        if isinstance(sink, HeldLog):
            if keep:
                sink.commit()
            else:
                dropped = sink.discard()
                log.debug("held_lines_dropped", session_key=key, lines=dropped)
                # The timeline keeps the turn; mark it so a rebuilt transcript drops it too.
                marker = getattr(self.hooks, "transcript_discarded", None)
                if marker is not None:
                    marker(entry, result.run_id, work.trigger, dropped)
        await self._settled(entry.session_id)
        counter = "heartbeats" if work.trigger == "heartbeat" else f"{work.trigger}_runs"
        if keep:
            agent.store.touch(key, activity=False, updated=True, counters={counter: 1})
        log.info("turn_done", session_key=key, run_id=result.run_id, status=result.status,
                 trigger=work.trigger, duration_ms=round(result.duration_ms, 2),
                 kept=keep, agent=agent.id)
        return result

    # -- commands ------------------------------------------------------------------------
    def _stranger(self, agent_id: str, works: list[Any]) -> str | None:
        """The first sender of ``works`` who is not an owner (``stranger_of``), or None."""
        if self.stranger_of is None:
            return None
        found = (self.stranger_of(agent_id, w.channel, w.sender_id) for w in works)
        return next((s for s in found if s), None)

    def _tainted_by(self, agent_id: str, works: list[Any]) -> list[str]:
        """What taints the turn from its start: senders who are not owners, and what
        tainted the turn a restart cut (``UserWork.tainted_by``, from its journal)."""
        found = [t for w in works for t in getattr(w, "tainted_by", ())]
        if self.sender_taint is not None:
            found += [self.sender_taint(agent_id, w.channel, w.sender_id) for w in works]
        return list(dict.fromkeys(r for r in found if r))


def _synthetic_lane_gone(key: str, work: SyntheticWork, sink: Any,
                         result: TurnResult) -> TurnResult:
    """A synthetic turn (heartbeat, cron, system) ended before a model round because
    its session's lane moved to another replica while this one was paused: that replica
    runs the session now. Its held lines are dropped (nothing of it is kept here),
    nothing is touched or delivered, and it ends ``skipped`` (``decide`` is told so, the
    cron run is recorded skipped rather than failed; a cron occurrence taken over is
    retried by its new replica). Returns the skipped TurnResult (error_class LANE_GONE)."""
    if isinstance(sink, HeldLog):
        sink.discard()
    result.status, result.error = "skipped", "taken over by another replica"
    if work.decide is not None:
        work.decide(result)
    log.info("synthetic_turn_lane_gone", session_key=key, run_id=result.run_id,
                trigger=work.trigger, rounds=result.rounds)
    return result


def user_scope(agent: Agent, w: UserWork, asker: Any = None,
               stranger: str | None = None) -> ToolScope:
    """The tool scope of a user turn: where the message came from (tool policy layer 7,
    channel tools), the agent's provider, whose memory it uses (``asker``) and the
    sender who is not an owner it acts for (``stranger``)."""
    return ToolScope(agent.id, agent.provider, channel=w.channel, account=w.account_id,
                     chat_type=w.chat_type, group_id=w.group_id, route=w.route,
                     message_id=w.message_id, asker=asker, stranger=stranger)


def _user_text(w: UserWork, logged: bool = False) -> UserText:
    media = getattr(w, "media", None) or ()
    if media:
        from runtime.media.ref import MediaRef  # loads with the first message with a file
        media = [MediaRef.from_dict(m) for m in media]
    return UserText(text=attributed(w), sender=w.sender_name or w.sender_id,
                    message_id=transcript_id(w), received_at=w.received_at, logged=logged,
                    media=list(media))


def _logged(w: UserWork, slog: Any) -> bool:
    """A message resumed after a crash whose turn had already written it to the
    transcript (gateway/journal/resume.py): it is not appended a second time."""
    return w.resume is not None and \
        bool(logged_messages(slog.entries_reversed(), [transcript_id(w)])[0])


async def _resumed(works: list[UserWork], slog: Any, key: str
                   ) -> tuple[set[int], str | None]:
    """A turn resumed after a crash: ``(ids of the works whose message the transcript
    holds already as its newest user messages, the turn's final answer if it had
    finished)`` (resume.py ``logged_messages``, :func:`_answered`); ``(set(), None)`` for a
    new turn. Read in a worker thread: a transcript in PostgreSQL is read through its
    blocking bridge, never on the loop."""
    if all(w.resume is None for w in works):
        return set(), None

    def read() -> tuple[set[int], str | None]:
        resumed = [w for w in works if w.resume is not None]
        tail, behind = logged_messages(slog.entries_reversed(),
                                       [transcript_id(w) for w in resumed])
        if behind:  # another turn of the session ran first: answered out of order
            log.warning("resumed_message_written_again", session_key=key,
                        message_ids=sorted(behind),
                        reason="a later user message follows it in the transcript")
        return {id(w) for w in resumed if transcript_id(w) in tail}, _answered(works, slog)
    return await asyncio.to_thread(read)


def _answered(works: list[UserWork], slog: Any) -> str | None:
    """A resumed turn that had finished before the crash (its final answer is in the
    transcript, its reply was never marked as sending): that answer, else None."""
    if any(w.resume is None or not transcript_id(w) for w in works):
        return None
    return answered_in_transcript(slog.entries_reversed(), [transcript_id(w) for w in works])
