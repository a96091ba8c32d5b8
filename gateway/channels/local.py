"""Local chat: messages from the CLI (``tidegate agent``/``chat``), the webchat page and the
OpenAI-compatible API. They are token-authenticated, so no access policy applies; they use
the same routing, lanes and turn code as every other channel, and the caller awaits the
turn's result instead of a delivery."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from channels.base import InboundMessage
from gateway.inbound.intake import HELP_TEXT, LANE_COMMANDS, parse_command, stop_reply
from gateway.routing import agent_of_key, canonical_key
from gateway.turns.work import CommandWork, UserWork, new_run_id
from runtime.turn import TurnResult


class LocalRequestError(ValueError):
    """A bad local request (unknown agent, malformed session key); HTTP 400."""


@dataclass(slots=True)
class Submitted:
    """A queued local message: its turn's ``future``, ``session_key`` (canonical),
    ``agent_id`` and ``run_id``; :attr:`shown_key` is the key as people write it."""

    future: asyncio.Future
    session_key: str
    agent_id: str
    run_id: str

    @property
    def shown_key(self) -> str:
        """The session key as a person writes it (``...:dm:CaseUser``; gateway/routing.py
        ``readable_key``): what the ``X-Session-Key`` header and the webchat show."""
        from gateway.routing import readable_key
        return readable_key(self.session_key)


class LocalChat:
    def __init__(self, gateway: Any) -> None:
        self.gw = gateway

    @property
    def lanes(self) -> Any:
        """The lanes every entry point uses: the intake's (replicas: the cluster's, so the
        turn runs on the replica that holds the session's lane)."""
        return self.gw.intake.lanes

    def resolve(self, *, agent_id: str | None = None, session_key: str | None = None,
                to: str | None = None, channel: str = "cli") -> tuple[str, str]:
        """(agent_id, session_key) for a local message. Raises LocalRequestError."""
        agents = self.gw.agents
        if session_key:
            key = canonical_key(session_key)
            try:
                agent = agent_of_key(key)
            except ValueError as exc:
                raise LocalRequestError(str(exc)) from None
            if agent not in agents:
                raise LocalRequestError(f"session key names unknown agent {agent!r}")
            if agent_id and agent_id.lower() != agent:
                raise LocalRequestError("--agent does not match the session key's agent")
            return agent, key
        agent = (agent_id or self.gw.config.default_agent()).lower()
        if agent not in agents:
            raise LocalRequestError(f"unknown agent {agent!r} (have: {', '.join(agents)})")
        msg = InboundMessage(channel=channel, text="", sender_id=to or "local", chat_type="dm")
        return agent, self.gw.intake.route(msg, agent_id=agent).session_key

    def submit(self, text: str, *, agent_id: str | None = None, session_key: str | None = None,
               to: str | None = None, channel: str = "cli",
               sender: str | None = None, stream: bool = False,
               client_tools: list[dict] | None = None,
               tool_results: list[dict] | None = None) -> Submitted:
        """Queue ``text`` on its session's lane; the future resolves to a TurnResult.

        ``stream``: the caller consumes text deltas (webchat, ``stream: true`` API calls),
        so the model is called streaming; otherwise it is not."""
        if not isinstance(text, str) or not (text.strip() or tool_results):
            raise LocalRequestError("message text is required")
        agent, key = self.resolve(agent_id=agent_id, session_key=session_key, to=to,
                                  channel=channel)
        cmd = parse_command(text) if not tool_results else None
        loop = asyncio.get_running_loop()
        if cmd and cmd[0] in ("help", "status", "stop", "usage", "subagents"):
            entry = self.gw.agents[agent].store.get(key)
            run_id = new_run_id()
            sid = entry.session_id if entry else ""
            if cmd[0] == "usage":  # reads the ledger: awaited, off the caller's path
                fut = asyncio.ensure_future(self._usage(agent, key, run_id, sid))
                return Submitted(fut, key, agent, run_id)
            fut = loop.create_future()
            if cmd[0] == "stop":
                reply = stop_reply(self.lanes.abort(key, drop_queued=cmd[1].lower() == "all"))
            elif cmd[0] == "subagents":
                reply = self.gw.subagents.chat_command(key, cmd[1])
            else:
                reply = HELP_TEXT if cmd[0] == "help" else self.gw.status_text(agent, key)
            fut.set_result(TurnResult(run_id, key, sid, "ok", reply))
            return Submitted(fut, key, agent, run_id)
        if cmd and cmd[0] in LANE_COMMANDS:
            work = CommandWork(agent_id=agent, command=cmd[0], channel=channel, args=cmd[1])
            fut = self.lanes.submit(key, work, mergeable=False)
            return Submitted(fut, key, agent, work.run_id)
        uw = UserWork(agent_id=agent, text=text, channel=channel, sender_id=to or "local",
                      sender_name=sender, received_at=self.gw.clock.time(), stream=stream,
                      client_tools=list(client_tools or ()),
                      tool_results=list(tool_results or ()))
        # No idle debounce: the caller waits for this message's own answer and it never
        # shares a turn (gateway/turns/work.py reply_route), so a window would only delay it.
        fut = self.lanes.submit(key, uw)
        if getattr(self.gw, "cluster", None) is None:
            # accepted: its outcome survives a crash too (replicas: its work row in
            # PostgreSQL does, taken over and run by the next holder of its lane)
            self.gw.outcomes.accept_local(uw, key)
        self.gw.outcomes.watch(uw, key, fut)  # its one outcome, however the turn ends
        return Submitted(fut, key, agent, uw.run_id)

    async def _usage(self, agent: str, key: str, run_id: str, sid: str) -> TurnResult:
        return TurnResult(run_id, key, sid, "ok", await self.gw.usage.usage_text(agent, key))

    async def send(self, text: str, **kwargs: Any) -> TurnResult:
        sub = self.submit(text, **kwargs)
        return await sub.future
