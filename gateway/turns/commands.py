"""The chat commands' grammar and texts (issue 13 "Commands"): which words are commands
(``parse_command``; ``LANE_COMMANDS`` run in order with the session's turns), ``/help``,
the ``/stop`` reply, ``/model [ref|list|default]`` and ``/think``. ``/model`` is a per-session model override kept
in the session entry (``model_override`` in sessions.json, so it survives a restart),
validated against the configured models; ``default`` clears it. ``/new`` starts a fresh
session, and with it the agent's default model.

Configured models: every agent's ``model`` (primary and fallbacks) and every
``models.providers.<p>.models.<name>`` (as ``<p>/<name>``).
"""

from __future__ import annotations

import re
from typing import Any

UNCHANGED = object()

_COMMAND = re.compile(r"^/([a-z]+)(?:\s+(.*))?$", re.IGNORECASE | re.DOTALL)
LANE_COMMANDS = {"new", "reset", "end", "model", "verbose", "think", "compact", "fork",
                 "rewind"}
COMMANDS = LANE_COMMANDS | {"help", "status", "stop", "usage", "subagents", "activation",
                           "forget"}


def is_activation(text: str) -> bool:
    """Whether ``text`` is ``/activation ...`` (answered in a group without a mention)."""
    cmd = parse_command(text)
    return bool(cmd) and cmd[0] == "activation"


def parse_command(text: str) -> tuple[str, str] | None:
    """``("new", "")`` for ``/new``, else None. The Telegram adapter turns ``/new@<this
    bot>`` into ``/new``; a ``/new@<another bot>`` left as it is was meant for that bot
    (several bots in one group) and is no command here."""
    m = _COMMAND.match(text.strip())
    if not m:
        return None
    return m.group(1).lower(), (m.group(2) or "").strip()


HELP_TEXT = (
    "Commands:\n"
    "/new or /reset — start a fresh session\n"
    "/end — end this session (the next message starts a new one)\n"
    "/fork [N] — go on in a new session holding the first N turns (default: all)\n"
    "/rewind N — go back to turn N (later turns stay in the old transcript)\n"
    "/stop — stop the running turn (queued messages still run); /stop all drops them too\n"
    "/status — session and gateway status\n"
    "/usage — tokens and cost of this session, today and this month\n"
    "/subagents — subagent runs of this session (/subagents kill ID stops one)\n"
    "/model [ref|list|default] — show, switch (this session) or reset the model\n"
    "/compact — summarise this session's older context now\n"
    "/think off|low|medium|high — reasoning effort (where the provider supports it)\n"
    "/verbose on|off — show a tool progress line while tools run\n"
    "/activation mention|always — in a group: answer only when mentioned, or always\n"
    "/forget [all|ID] — see or delete what I remembered about you\n"
    "/help — this help"
)


def stop_reply(outcome: dict[str, Any]) -> str:
    """The reply to ``/stop`` from ``LaneManager.abort``'s outcome."""
    text = "Stopped." if outcome["aborted"] else "Nothing is running."
    if outcome["queued"]:
        n = outcome["queued"]
        text += f" {n} queued message{'s' if n != 1 else ''} will run next."
    if outcome["dropped"]:
        n = outcome["dropped"]
        text += f" Dropped {n} queued message{'s' if n != 1 else ''}."
    return text


def configured_models(config: Any) -> list[str]:
    """The model refs ``/model`` accepts, sorted."""
    refs: set[str] = set()
    for agent_id in config.agent_ids():
        settings = config.agent(agent_id)
        refs.update(r for r in (settings.model_primary, *settings.model_fallbacks) if r)
    for name, provider in config.models.providers.items():
        refs.update(f"{name}/{model}" for model in provider.models)
    return sorted(refs)


def model_command(args: str, *, current: str | None, default: str | None,
                  known: list[str]) -> tuple[str, Any]:
    """``(reply text, new override)``; the override is ``UNCHANGED``, ``None`` (cleared)
    or a ref from ``known``."""
    arg = args.strip()
    listing = "\n".join(f"• {r}" for r in known) or "(no models configured)"
    if not arg:
        using = current or default or "the built-in echo model"
        note = " (this session's choice)" if current else " (the agent's default)"
        return f"Model: {using}{note}.\nConfigured:\n{listing}", UNCHANGED
    if arg == "list":
        return f"Configured models:\n{listing}", UNCHANGED
    if arg == "default":
        return f"Model reset to the agent's default ({default or 'echo'}).", None
    if arg not in known:
        return f"Unknown model {arg!r}. Configured:\n{listing}", UNCHANGED
    return f"Model for this session: {arg}.", arg


THINK_LEVELS = ("off", "low", "medium", "high")
THINK_APIS = ("openai", "anthropic")  # provider APIs that take a /think level


def think_command(args: str, *, current: str | None, api: str) -> tuple[str, Any]:
    """``/think off|low|medium|high`` -> (reply, new level: ``UNCHANGED``, None for off, or
    the level). Reasoning effort reaches OpenAI-API providers as ``reasoning_effort`` and
    Anthropic as extended thinking (``thinking.budget_tokens`` 1024/4096/16000,
    runtime/providers/anthropic_provider.py); other providers keep the setting but ignore
    it, and the reply says so."""
    arg = args.strip().lower()
    note = "" if api in THINK_APIS else (
        f" (the {api} provider has no reasoning-effort setting here: it is ignored)")
    if not arg:
        return f"Thinking: {current or 'off'}{note}. Use /think off|low|medium|high.", UNCHANGED
    if arg not in THINK_LEVELS:
        return f"Unknown level {arg!r}. Use /think off|low|medium|high.", UNCHANGED
    level = None if arg == "off" else arg
    return f"Thinking set to {arg} for this session{note}.", level
