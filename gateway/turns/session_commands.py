"""Running the lane commands (``LANE_COMMANDS`` in gateway/turns/commands.py, whose
grammar and texts live there) against a session: a fresh session for ``/new`` and
``/reset``, ``/end``, the per-session ``/model``, ``/think`` and ``/verbose`` settings,
``/fork`` and ``/rewind``, and ``/compact``. Each runs on the session's lane, in order
with its turns, and answers the chat it came from with a notice.
"""

from __future__ import annotations

from typing import Any

import structlog

from gateway.agents import Agent
from gateway.outbound.tool_progress import verbose_command
from gateway.sessions.entry import SessionEntry
from gateway.turns.commands import UNCHANGED, model_command, think_command
from gateway.turns.work import CommandWork
from runtime.turn import TurnInput, TurnResult

log = structlog.get_logger(__name__)


async def run_command(ex: Any, key: str, work: CommandWork) -> TurnResult:
    """Run lane command ``work`` (``/new``, ``/reset``, ``/end``, ``/model``, ``/think``,
    ``/fork``, ``/rewind``, ``/compact``, ``/verbose``) on session ``key`` for the
    executor ``ex`` (gateway/turns/executor.py ``TurnExecutor``), deliver its reply to
    the command's chat, and return it as an ``ok`` TurnResult."""
    agent = ex.agents[work.agent_id]
    entry = agent.store.get(key)
    if work.command in ("new", "reset"):
        entry = await ex.fresh_session(agent, key, reason=work.command,
                                       route=work.route.as_dict() if work.route else None)
        text = "Started a new session."
    elif work.command == "end":
        if entry is not None:
            await ex.end_session(agent, entry, "end")
            agent.store.remove(key)
            text = "Session ended. Your next message starts a new one."
        else:
            text = "There is no active session."
    elif work.command == "model":
        entry = entry or await ex.ensure_session(agent, key, activity=False)
        text, ref = model_command(work.args, current=entry.model_override,
                                  default=agent.settings.model_primary,
                                  known=ex.known_models())
        if ref is not UNCHANGED:
            agent.store.set_model(key, ref)
            log.info("session_model_set", session_key=key, model=ref)
    elif work.command == "think":
        entry = entry or await ex.ensure_session(agent, key, activity=False)
        text, level = think_command(work.args, current=entry.think, api=agent.api)
        if level is not UNCHANGED:
            agent.store.set_think(key, level)
            log.info("session_think_set", session_key=key, level=level or "off")
    elif work.command in ("fork", "rewind"):
        from gateway.sessions.fork import fork_command
        text, entry = await fork_command(ex, agent, key, entry, work)
    elif work.command == "compact":
        text = await _compact(ex, agent, key, entry, work.run_id)
    elif work.command == "verbose":
        entry = entry or await ex.ensure_session(agent, key, activity=False)
        text, on = verbose_command(work.args, entry.verbose)
        if on is not None:
            agent.store.set_verbose(key, on)
    else:
        text = f"Unknown command /{work.command}."
    result = TurnResult(work.run_id, key, entry.session_id if entry else "", "ok", text)
    if work.route is not None:
        await ex.deliverer.send(work.route, text, kind="notice", session_key=key,
                                answers=work.answers)
    return result


async def _compact(ex: Any, agent: Agent, key: str, entry: SessionEntry | None,
                   run_id: str) -> str:
    """``/compact``: the session's older context summarised now (on its lane, so
    never beside a running turn)."""
    if entry is None:
        return "There is no session to compact."
    slog = await ex._log_for(agent, entry)
    before = slog.tokens
    ok = await agent.runner.compact_now(
        TurnInput(session_key=key, session_id=entry.session_id, run_id=run_id,
                  model=entry.model_override), slog)
    await ex._settled(entry.session_id)
    log.info("session_compact_command", session_key=key, compacted=ok,
             tokens_before=before, tokens_after=slog.tokens)
    return _compact_reply(ok, before, slog.tokens)


def _compact_reply(ok: bool, before: int, after: int) -> str:
    if not ok:
        return "Nothing to compact yet (or the summary failed; see the log)."
    return f"Compacted this session: context about {before:,} → {after:,} tokens."
