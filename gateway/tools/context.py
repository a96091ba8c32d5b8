"""What a tool call sees of the gateway (seed 001 §tools): its :class:`ToolContext` —
workspace, exec limits, the ``message`` tool's send (to a named chat, or back to where the
session's last message came from), background-exec completion as a system event, and the
services behind the other tools (cron, web, sessions, subagents, channel actions, skills).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from gateway.config.secrets import runtime_secrets, secret_scrubber
from gateway.inbound.file_lines import canonical_of, exec_taint
from gateway.routing import Route, agent_of_key
from gateway.tools.services import channel_action
from runtime.sandbox.docker import owner_id as docker_owner_id
from runtime.sandbox.wrap import Sandbox, sandboxed
from runtime.tools.registry import ToolContext, ToolError

Gateway = Any  # gateway.service.daemon.Gateway (not imported: the daemon imports this module)


def tool_context(gw: Gateway, agent_id: str, session_key: str,
                 stranger: str | None = None) -> ToolContext:
    """The context of one tool call in ``session_key`` of ``agent_id``: its workspace, exec
    limits, and the gateway services tools reach (``extra``; runtime/tools/registry.py).
    ``stranger``: the turn acts for a sender who is not an owner (``TurnInput.stranger``),
    whose commands sandbox mode non-main sandboxes even in the main session."""
    settings = gw.config.agent(agent_id)
    scrubber = secret_scrubber(gw.loaded, runtime_secrets(gw))
    return ToolContext(
        workspace=gw.config.workspace_for(agent_id), session_key=session_key,
        agent_id=agent_id, clock=gw.clock, exec_timeout=settings.exec.timeout,
        exec_max_output=settings.exec.max_output_chars,
        secret_env=gw.loaded.secret_refs, secrets=scrubber,
        send_message=functools.partial(_send, gw, session_key=session_key),
        on_background_done=lambda key, text, taint=(): gw.scheduling.enqueue(
            key, scrubber.scrub(text, where="exec:background", session_key=key), "exec",
            wake=True, taint=taint),
        extra={"background_max": settings.exec.background_max, "gateway": gw,
               "exec_env": settings.tools.exec.env,
               "sandbox": sandbox_of(gw, settings, agent_id, session_key, stranger),
               "memory_decay_lambda": gw.config.memory.time_decay_lambda,
               "memory": getattr(gw, "memory", None),
               "user_timezone": settings.user_timezone,
               "cron": gw.scheduling.cron_access, "web": gw.web,
               "sessions": gw.sessions_access,
               "subagents": gw.subagents,
               "channel_action": lambda *a: channel_action(gw, *a),
               "file_taint": functools.partial(file_taint, gw),
               "exec_taint": functools.partial(exec_taint, gw),
               "skill_roots": gw.agents[agent_id].skills.roots()
               if agent_id in gw.agents else []},
        before_side_effect=gw.cluster.work.tool_began if gw.cluster is not None else None,
        on_taint=gw.cluster.work.tainted if gw.cluster is not None else None,
        gate=gw.approvals.gate)


def file_taint(gw: Gateway, agent_id: str, rel: str, sha256: str = "") -> str | None:
    """Why reading workspace file ``rel`` of ``agent_id`` (its bytes' SHA-256
    ``sha256``, "" unknown) taints the turn (a file a non-owner sent, or a copy of one:
    gateway/inbound/provenance.py), or None."""
    provenance = getattr(gw, "provenance", None)
    if provenance is None or getattr(gw, "approvals", None) is None:
        return None
    return provenance.taint(agent_id, rel, gw.approvals.sender_taint,
                            canonical_of(gw), sha256=sha256)



def sandbox_of(gw: Gateway, settings: Any, agent_id: str, session_key: str,
               stranger: str | None = None) -> Any:
    """The sandbox of this session's commands (runtime/sandbox/), None on the host. The
    state dir, the gateway user's home and the other agents' workspaces are hidden from
    it, the config file and the env file blanked."""
    if not sandboxed(settings.sandbox, agent_id, session_key, stranger=stranger is not None):
        return None
    mine = gw.config.workspace_for(agent_id).resolve()
    others = {gw.config.workspace_for(a).resolve() for a in gw.config.agent_ids()} - {mine}
    files = [getattr(gw.loaded, "path", None),
             getattr(getattr(gw.loaded, "env_file", None), "path", None)]
    return Sandbox(settings.sandbox,
                   (gw.state_dir.resolve(), Path.home().resolve(), *sorted(others)),
                   tuple(Path(f).resolve() for f in files if f),
                   owner=docker_owner_id(gw.state_dir))


async def _send(gw: Gateway, channel: str, to: str, text: str, *,
                media: list[str] | None = None, session_key: str | None = None) -> str:
    """The ``message`` tool's send: to ``channel``/``to``, or (``channel`` empty) back to
    the session's chat. Raises RuntimeError when delivery failed."""
    from gateway.outbound.media import tool_media
    route = (Route.from_tool(channel, to) if channel
             else session_route(gw, session_key))
    paths = await tool_media(gw, route.channel, media or [], session_key)
    result = await gw.deliverer.send(route, text, kind="message", media=paths,
                                     session_key=session_key)
    if session_key and text.strip() and (result.ok or result.unconfirmed):
        gw.deliverer.note_tool_send(session_key, route, text)
    if result.unconfirmed:
        return (f"sent, but {route.channel} did not confirm it (the connection "
                f"dropped); it may have arrived, so do not send it again")
    if not result.ok:
        raise RuntimeError(result.error or "delivery failed")
    return f"sent ({len(result.message_ids)} part(s))"


def session_route(gw: Gateway, session_key: str | None):
    """Where the session's last message came from (ToolError when there is none)."""
    route = gw.executor.routes.get(session_key or "")  # the running turn's chat
    try:
        agent = gw.agents.get(agent_of_key(session_key or ""))
    except ValueError:
        agent = None
    entry = agent.store.get(session_key) if agent and session_key else None
    if route is None and entry is not None:
        route = Route.from_dict(entry.last_route)
    if route is None:
        raise ToolError("this conversation has no chat to send to; give channel and to")
    return route
