"""Subagents in the gateway (seed 001 §6): the host of ``runtime.subagents.service`` —
child turns on the ``subagent`` lane in ``agent:<agent>:subagent:<uuid>`` with their own
tool layer, announces as a system event plus a woken turn in the requester session whose
reply goes to the requester's route, timeline events, session cleanup — and the
``sessions_spawn`` access for the tool.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import structlog
from aiohttp import web

from channels.base import OutboundMessage
from gateway.routing import Route, subagent_session_key
from gateway.server.control_api import require_token
from gateway.turns.work import SyntheticWork, turn_lanes
from runtime.lanes import TurnInterrupted
from runtime.subagents.announce import ANNOUNCE_PROMPT
from runtime.subagents.records import CorruptRunsFile, RunRecord, RunStore
from runtime.subagents.service import SubagentService
from runtime.tools.policy import ToolScope
from runtime.tools.registry import ToolContext
from runtime.turn import TurnResult
from scheduler.heartbeat.rules import strip_heartbeat_ack

log = structlog.get_logger(__name__)


class GatewaySubagents:
    """``SubagentHost`` over the gateway, plus the ``SubagentAccess`` of the tool."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        from gateway.service.storage import records
        store = RunStore(gw.state_dir / "subagents" / "runs.json",
                         records=records(gw, "subagents"))  # PostgreSQL: every replica's
        self.service = SubagentService(self, store, gw.clock, gw.problems)
        self._cleanups: set[asyncio.Task] = set()

    async def start(self) -> None:
        self.service.start()

    async def stop(self) -> None:
        await self.service.stop()

    # -- the sessions_spawn tool ---------------------------------------------------------
    async def spawn(self, ctx: ToolContext, spec: dict[str, Any]) -> dict[str, Any]:
        scope = ctx.scope if isinstance(ctx.scope, ToolScope) else None
        agent_id = (spec.get("agent") or ctx.agent_id).lower()
        if agent_id != ctx.agent_id and self.gw.config.tools.sessions.visibility != "all":
            raise PermissionError("spawning another agent's subagent needs "
                                  "tools.sessions.visibility: all")
        if agent_id not in self.gw.agents:
            raise LookupError(f"unknown agent {agent_id!r}")
        requester = self.gw.agents[ctx.agent_id].store.get(ctx.session_key)
        limits = self.gw.config.agent(ctx.agent_id).subagents
        rec = self.service.spawn(
            requester_key=ctx.session_key,
            requester_session_id=requester.session_id if requester else "",
            agent_id=agent_id, depth=(scope.subagent_depth if scope else 0) + 1,
            max_depth=limits.max_depth, max_children=limits.max_children, spec=spec,
            child_key=subagent_session_key,
            extra={**_asker_extra(scope), **_taint_extra(ctx)})
        return {"run_id": rec.run_id, "child_session_key": rec.child_session_key}

    def runs_of(self, key: str) -> list[RunRecord]:
        return self.service.runs_of(key)

    def chat_command(self, session_key: str, arg: str) -> str:
        """``/subagents`` (this session's runs) and ``/subagents kill <run_id>``."""
        words = arg.split()
        if self.service.disabled:
            return f"Subagents are disabled: {self.service.disabled}"
        if words[:1] == ["kill"] and len(words) == 2:
            rec = self.service.get(words[1])
            if rec is None or rec.requester_session_key != session_key:
                return f"No subagent run {words[1]} in this session."
            if not rec.active:
                return f"Subagent run {rec.run_id} already ended ({rec.status})."
            self.service.kill(rec.run_id)
            return f"Killing subagent run {rec.run_id}."
        return describe_runs(self.runs_of(session_key), self.gw.clock.time())

    # -- SubagentHost --------------------------------------------------------------------
    async def run_child(self, rec: RunRecord) -> tuple[str, str, str | None]:
        agent = self.gw.agents[rec.agent_id]
        limits = self.gw.config.agent(rec.agent_id).subagents
        timeout = rec.timeout or limits.run_timeout or agent.settings.timeout
        work = SyntheticWork(
            agent_id=rec.agent_id, trigger="subagent", model=rec.model, timeout=timeout,
            prompt=rec.task, environment={"Subagent run": rec.run_id,
                                          "Requested by": rec.requester_session_key},
            tool_scope=ToolScope(rec.agent_id, agent.provider, subagent_depth=rec.depth,
                                 asker=_asker_of(rec), stranger=rec.extra.get("stranger")),
            tainted_by=list(rec.extra.get("requester_taint") or ()))
        result = await turn_lanes(self.gw).submit(rec.child_session_key, work, kind="subagent",
                                            mergeable=False)
        if isinstance(result, TurnInterrupted):
            return "killed", "", "killed"
        if not isinstance(result, TurnResult):
            return "error", "", "the run did not complete"
        if result.tainted_by:  # its result is untrusted: so is the turn it reaches
            rec.extra["tainted_by"] = [f"subagent run {rec.run_id}: {t}"
                                       for t in result.tainted_by][:8]
        if result.status == "skipped" and result.error:  # the turn gate (budget) refused it
            return "refused", "", result.error
        status = result.status if result.status in ("ok", "timeout") else "error"
        return status, result.text, result.error

    def abort_child(self, rec: RunRecord) -> bool:
        return self.gw.lanes.abort(rec.child_session_key, reason="subagent")["aborted"]

    def requester_alive(self, rec: RunRecord) -> bool:
        agent = self.gw.agents.get(rec.requester_session_key.split(":")[1])
        entry = agent.store.get(rec.requester_session_key) if agent else None
        return entry is not None and entry.session_id == rec.requester_session_id

    async def announce(self, rec: RunRecord, text: str) -> bool:
        """System event + a held, ack-aware turn in the requester session. True once that
        turn ran: its reply goes to the requester's last route with the outbox behind it
        (a failed send is retried by the outbox, never by running the turn again, which
        would leave one more undelivered reply in the transcript per retry). False only
        when the turn itself failed (the service retries it)."""
        key = rec.requester_session_key
        agent_id = key.split(":")[1]
        # identical events collapse; a tainted run's result taints the announcing turn
        self.gw.scheduling.enqueue(key, text, "subagent", taint=rec.extra.get("tainted_by") or ())
        verdict: dict[str, Any] = {}

        def decide(result: Any) -> bool:
            ack = strip_heartbeat_ack(result.text) if result.status == "ok" else None
            verdict["text"] = ack.remaining if ack and not ack.is_ack else ""
            return not (ack and ack.is_ack)

        work = SyntheticWork(agent_id=agent_id, trigger="system", prompt=ANNOUNCE_PROMPT,
                             hold=True, decide=decide)
        result = await turn_lanes(self.gw).submit(key, work, mergeable=False)
        if not isinstance(result, TurnResult) or result.status != "ok":
            return False
        route = self._route(agent_id, key)
        if not verdict.get("text") or route is None:
            return True  # nothing to deliver, or a local session: the transcript has it
        sent = await self.gw.deliverer.send_message(
            _outbound(route, verdict["text"], key), queue_on_failure=True)
        if not sent.ok:
            log.warning("subagent_announce_delivery_failed", run_id=rec.run_id,
                        session_key=key, error=sent.error, queued=sent.retryable)
        return True

    def _route(self, agent_id: str, key: str) -> Route | None:
        entry = self.gw.agents[agent_id].store.get(key)
        return Route.from_dict(entry.last_route) if entry else None

    def park(self, rec: RunRecord, text: str) -> None:
        """An announce that never ran: to the outbox for a platform session; for a local
        one (webchat, CLI, OpenAI API: no route to send to) it stays a system event of the
        requester session, so its next turn carries it."""
        key = rec.requester_session_key
        agent_id = key.split(":")[1]
        route = self._route(agent_id, key) if agent_id in self.gw.agents else None
        if route is not None:
            self.gw.outbox.put(_outbound(route, text, key), "subagent announce failed")
            where = "outbox"
        else:
            self.gw.scheduling.enqueue(key, text, "subagent",
                                       taint=rec.extra.get("tainted_by") or ())
            where = "system_event"
        log.warning("subagent_announce_parked", run_id=rec.run_id, session_key=key,
                    parked_in=where)

    def delete_child_session(self, rec: RunRecord) -> None:
        agent = self.gw.agents.get(rec.agent_id)
        entry = agent.store.get(rec.child_session_key) if agent else None
        if entry is None:
            return
        agent.store.remove(rec.child_session_key)
        task = asyncio.get_running_loop().create_task(
            self.gw.executor.end_session(agent, entry, "subagent_cleanup"))
        self._cleanups.add(task)  # ends its timeline (SESSION_END) in the background
        task.add_done_callback(self._cleanups.discard)
        log.info("subagent_session_deleted", run_id=rec.run_id,
                 session_key=rec.child_session_key)

    def record(self, rec: RunRecord, event_type: str, content: dict[str, Any]) -> None:
        hooks = self.gw.timeline_hooks
        agent = self.gw.agents.get(rec.requester_session_key.split(":")[1])
        entry = agent.store.get(rec.requester_session_key) if agent else None
        if hooks is not None and entry is not None:
            hooks.record(entry.session_id, event_type, content)


def _outbound(route: Route, text: str, key: str) -> OutboundMessage:
    return OutboundMessage(channel=route.channel, to=route.to, text=text,
                           account_id=route.account, thread_id=route.thread, kind="subagent",
                           session_key=key)


def describe_runs(runs: list[RunRecord], now: float) -> str:
    """``/subagents`` text: one line per run, newest first."""
    if not runs:
        return "No subagent runs in this session."
    lines = []
    for r in sorted(runs, key=lambda r: r.created_at, reverse=True):
        age = int(now - r.created_at)
        label = f" {r.label}" if r.label else ""
        where = f" on replica {r.replica}" if r.replica else ""
        lines.append(f"{r.run_id}{label}: {r.status}{where}, {age}s ago, announce "
                     f"{r.announce_state} — {r.task[:60]}")
    return "\n".join(lines)


def subagent_routes(gw: Any) -> list[web.RouteDef]:
    """Control API (bearer token): ``GET /api/subagents`` (every run record: on PostgreSQL
    storage every replica's, each with ``replica``), ``GET /api/subagents/{run_id}``,
    ``POST /api/subagents/{run_id}/kill`` (409 when the run has already ended or runs on
    another replica; 503 when PostgreSQL cannot be read)."""
    service = gw.subagents.service

    async def found(request: web.Request) -> RunRecord:
        run_id = request.match_info["run_id"]
        rec = service.get(run_id)
        if rec is None and service.store.shared:
            rec = await _shared(service.store.get, run_id)
        if rec is None:
            raise web.HTTPNotFound(text='{"ok": false, "error": "no such run"}',
                                   content_type="application/json")
        return rec

    async def runs(_: web.Request) -> web.Response:
        """Subagent run records, newest first."""
        shared = await _shared(service.store.every) if service.store.shared else []
        listed = sorted(service.merged(shared), key=lambda r: r.created_at, reverse=True)
        return web.json_response({"ok": True, "disabled": service.disabled,
                                  "runs": [r.to_json() for r in listed]})

    async def show(request: web.Request) -> web.Response:
        """One subagent run record."""
        return web.json_response({"ok": True, "run": (await found(request)).to_json()})

    async def kill(request: web.Request) -> web.Response:
        """Stop a running subagent run (409 for a run that has already ended: there is
        nothing to kill; 409 for one another replica runs: kill it there)."""
        rec = await found(request)
        if not rec.active:
            return web.json_response(
                {"ok": False, "error": f"run {rec.run_id} already ended "
                                       f"(outcome {rec.status}); nothing to kill",
                 "run": rec.to_json()}, status=409)
        if service.get(rec.run_id) is None:
            return web.json_response(
                {"ok": False, "error": f"run {rec.run_id} runs on replica {rec.replica}; "
                                       "kill it through that replica", "run": rec.to_json()},
                status=409)
        return web.json_response({"ok": True, "run": service.kill(rec.run_id).to_json()})

    return [web.get("/api/subagents", require_token(gw, runs)),
            web.get("/api/subagents/{run_id}", require_token(gw, show)),
            web.post("/api/subagents/{run_id}/kill", require_token(gw, kill))]


async def _shared(read: Any, *args: Any) -> Any:
    """A read of the shared run records, off the event loop; 503 when it fails."""
    try:
        return await asyncio.to_thread(read, *args)
    except CorruptRunsFile as exc:
        raise web.HTTPServiceUnavailable(
            text=json.dumps({"ok": False, "error": f"subagent runs unreadable: {exc}"}),
            content_type="application/json") from None


def _asker_extra(scope: ToolScope | None) -> dict[str, Any]:
    """The run record's note of whose memory the child uses and which sender who is not
    an owner it acts for: the requester turn's (a child works for the same person; kept
    across restarts)."""
    asker = scope.asker if scope is not None else None
    note: dict[str, Any] = {} if asker is None else {
        "memory_asker": {"user": asker.user, "group": asker.group}}
    if scope is not None and scope.stranger:
        note["stranger"] = scope.stranger
    return note


def _taint_extra(ctx: ToolContext) -> dict[str, Any]:
    """The run record's note of what tainted the requester turn: the child's task came
    from it, so the child starts tainted (docs/exec.md "Tainted turns")."""
    taint = list(getattr(ctx, "taint", None) or ())
    return {"requester_taint": [f"spawned by a tainted turn: {t}" for t in taint][:8]} \
        if taint else {}


def _asker_of(rec: RunRecord) -> Any:
    note = rec.extra.get("memory_asker")
    if not note:
        return None
    from runtime.memory.scopes import Asker
    return Asker(note.get("user"), note.get("group"))  # ownership: checked per agent

