"""``/model [ref|list|default]`` and ``/think`` (issue 13 "Commands"): a per-session model override kept
in the session entry (``model_override`` in sessions.json, so it survives a restart),
validated against the configured models; ``default`` clears it. ``/new`` starts a fresh
session, and with it the agent's default model.

Configured models: every agent's ``model`` (primary and fallbacks) and every
``models.providers.<p>.models.<name>`` (as ``<p>/<name>``).
"""

from __future__ import annotations

from typing import Any

UNCHANGED = object()


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


def think_command(args: str, *, current: str | None, api: str) -> tuple[str, Any]:
    """``/think off|low|medium|high`` -> (reply, new level: ``UNCHANGED``, None for off, or
    the level). Reasoning effort reaches OpenAI-API providers as ``reasoning_effort``;
    other providers keep the setting but ignore it, and the reply says so."""
    arg = args.strip().lower()
    note = "" if api == "openai" else (
        f" (the {api} provider has no reasoning-effort setting here: it is ignored)")
    if not arg:
        return f"Thinking: {current or 'off'}{note}. Use /think off|low|medium|high.", UNCHANGED
    if arg not in THINK_LEVELS:
        return f"Unknown level {arg!r}. Use /think off|low|medium|high.", UNCHANGED
    level = None if arg == "off" else arg
    return f"Thinking set to {arg} for this session{note}.", level
