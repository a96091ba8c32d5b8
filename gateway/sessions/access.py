"""What the sessions tools may do, as seen from the calling session (runtime/tools/
sessions.py ``SessionsAccess``).

- Visibility: ``tools.sessions.visibility`` ``agent`` (default) shows and reaches only
  sessions of the calling agent; ``all`` every agent's. A turn acting for a sender who is
  not an owner (``ToolScope.stranger``) sees and reaches only its own session and the
  sessions of its subagents, whatever the setting: other people's conversations are
  theirs. Every refusal is logged (``sessions_tool_refused``).
- ``sessions_send`` runs a turn in the target session on its lane and returns the reply;
  each hop carries the chain of sessions it came through (``ToolScope.send_chain``): a
  send deeper than ``tools.sessions.send_max_depth`` is refused, and so is a send back
  into the chain (ping-pong: that session's lane is busy waiting for this reply).
- ``sessions_history`` is the transcript tail, tool results shortened to
  :data:`TOOL_RESULT_CHARS` characters.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import structlog

from gateway.routing import agent_of_key, canonical_key, readable_key
from gateway.turns.work import SyntheticWork, turn_lanes
from runtime.clock import utc_iso
from runtime.tools.policy import ToolScope
from runtime.tools.registry import ToolContext
from runtime.turn import TurnResult

log = structlog.get_logger(__name__)

TOOL_RESULT_CHARS = 200
HISTORY_BYTES = 512 * 1024


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


def history_rows(entries: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` messages as ``{role, text, timestamp, tool?}`` rows."""
    rows = []
    for e in entries:
        msg = e.get("message") if e.get("type") == "message" else None
        if not isinstance(msg, dict):
            continue
        text = _text_of(msg)
        row = {"role": msg.get("role"), "timestamp": e.get("timestamp")}
        if msg.get("role") == "toolResult":
            row["tool"] = msg.get("toolName")
            if len(text) > TOOL_RESULT_CHARS:
                text = text[:TOOL_RESULT_CHARS] + f"… [{len(text)} chars]"
        calls = [c.get("name") for c in (msg.get("content") or [])
                 if isinstance(c, dict) and c.get("type") == "toolCall"] \
            if isinstance(msg.get("content"), list) else []
        if calls:
            row["tool_calls"] = calls
        row["text"] = text
        rows.append(row)
    return rows[-limit:]


class SessionsAccessImpl:
    """The gateway's implementation of ``SessionsAccess``."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw

    def _own_only(self, ctx: ToolContext) -> set[str] | None:
        """The sessions a turn acting for a sender who is not an owner may reach (its
        own and its subagents'), None when the turn is an owner's or the operator's."""
        scope = ctx.scope if isinstance(ctx.scope, ToolScope) else None
        if scope is None or not scope.stranger:
            return None
        subagents = getattr(self.gw, "subagents", None)
        runs = subagents.runs_of(ctx.session_key) if subagents is not None else []
        return {ctx.session_key, *(r.child_session_key for r in runs)}

    def _visible(self, ctx: ToolContext, key: str) -> tuple[Any, Any]:
        key = canonical_key(key)  # ...:dm:CaseUser names CaseUser's session, not caseuser's
        try:
            agent_id = agent_of_key(key)
        except ValueError:
            raise ValueError(f"not a session key: {key!r}") from None
        if agent_id != ctx.agent_id and self.gw.config.tools.sessions.visibility != "all":
            raise PermissionError(f"session {key} belongs to agent {agent_id!r}; "
                                  f"tools.sessions.visibility allows only your own")
        own = self._own_only(ctx)
        if own is not None and key not in own:
            log.warning("sessions_tool_refused", session_key=ctx.session_key, target=key,
                        stranger=ctx.scope.stranger,
                        reason="a sender who is not an owner reaches only their own session")
            raise PermissionError(f"session {key} is not this conversation's: a turn for "
                                  "a sender who is not an owner reaches only its own session")
        agent = self.gw.agents.get(agent_id)
        entry = agent.store.get(key) if agent else None
        if entry is None:
            raise LookupError(f"no session {key}")
        return agent, entry

    def list(self, ctx: ToolContext, limit: int) -> list[dict[str, Any]]:
        every = self.gw.config.tools.sessions.visibility == "all"
        own = self._own_only(ctx)
        rows = []
        for agent in self.gw.agents.values():
            if not every and agent.id != ctx.agent_id:
                continue
            for e in agent.store.entries():
                if own is not None and e.session_key not in own:
                    continue
                route = e.last_route or {}
                rows.append({"key": readable_key(e.session_key), "agent": agent.id,
                             "channel": route.get("channel") or _channel_of(e.session_key),
                             "last_activity": utc_iso(e.last_active_at or e.updated_at),
                             "current": e.session_key == ctx.session_key})
        rows.sort(key=lambda r: r["last_activity"], reverse=True)
        return rows[:limit]

    def history(self, ctx: ToolContext, key: str, limit: int) -> list[dict[str, Any]]:
        agent, entry = self._visible(ctx, key)
        tail = self.gw.logs.transcripts.tail(agent.id, entry.session_id, HISTORY_BYTES)
        return history_rows(tail.entries, limit)

    async def send(self, ctx: ToolContext, key: str, text: str) -> str:
        agent, entry = self._visible(ctx, key)
        scope = ctx.scope if isinstance(ctx.scope, ToolScope) else None
        chain = (*(scope.send_chain if scope else ()), ctx.session_key)
        if entry.session_key in chain:
            # That session is waiting for this very reply: its lane is busy (a deadlock).
            raise ValueError(f"{entry.session_key} is waiting for your answer; reply "
                             f"instead of sending to it")
        limit = self.gw.config.tools.sessions.send_max_depth
        if len(chain) > limit:
            raise PermissionError(f"sessions_send depth limit reached ({limit}): answer "
                                  f"instead of sending again")
        base = ToolScope(agent.id, agent.provider)
        work = SyntheticWork(
            agent_id=agent.id, trigger="agent", model=None,
            prompt=f"Message from session {ctx.session_key} (agent {ctx.agent_id}):\n{text}",
            environment={"From session": ctx.session_key},
            tool_scope=dataclasses.replace(base, send_chain=chain,
                                           asker=scope.asker if scope else None,
                                           stranger=scope.stranger if scope else None),
            # the message came from a tainted turn: the turn it starts is tainted too
            tainted_by=[f"sessions_send from a tainted turn: {t}" for t in ctx.taint][:8])
        result = await turn_lanes(self.gw).submit(entry.session_key, work, mergeable=False)
        if not isinstance(result, TurnResult):
            raise RuntimeError("the target session's turn was interrupted")
        return result.text

    def status(self, ctx: ToolContext, key: str | None) -> dict[str, Any]:
        agent, entry = self._visible(ctx, key or ctx.session_key)
        subagents = getattr(self.gw, "subagents", None)
        runs = subagents.runs_of(entry.session_key) if subagents is not None else []
        return {"key": readable_key(entry.session_key), "session_id": entry.session_id,
                "agent": agent.id,
                "model": agent.settings.model_primary or "echo/diagnostic",
                "created_at": utc_iso(entry.created_at),
                "updated_at": utc_iso(entry.updated_at), "counters": dict(entry.counters),
                "subagent_runs": [{"run_id": r.run_id, "status": r.status} for r in runs]}


def _channel_of(key: str) -> str | None:
    parts = key.split(":")
    return parts[2] if len(parts) > 3 and parts[2] not in ("dm", "main") else None
