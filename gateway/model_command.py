"""``/model [ref|list|default]`` (issue 13 "Commands"): a per-session model override kept
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
