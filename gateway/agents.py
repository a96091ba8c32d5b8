"""Per-agent runtime objects built from config: workspace, session store, prompt builder,
model chain and turn runner (one of each per agent, built once at start and on reload)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config import AgentSettings, Config
from gateway.sessions import SessionStore
from runtime.clock import Clock
from runtime.events import EventBus
from runtime.media.vision import MediaPolicy
from runtime.model_call import ModelCaller
from runtime.prompt import Identity, PromptBuilder, ensure_workspace
from runtime.tools.registry import ToolContext, ToolRegistry
from runtime.turn import AgentRunner


@dataclass
class Agent:
    """Everything the gateway keeps for one agent."""

    id: str
    settings: AgentSettings
    workspace: Path
    store: SessionStore
    prompt: PromptBuilder
    runner: AgentRunner


def media_policy(cfg: Config, workspace: Path) -> MediaPolicy:
    """Image handling for one agent's model calls (``media.image``, per-model vision)."""
    img = cfg.media.image
    return MediaPolicy(workspace=workspace, max_side=img.max_side, keep_turns=img.keep_turns,
                       vision=cfg.vision_settings(),
                       apis={n: p.api for n, p in cfg.models.providers.items()})


def build_agent(agent_id: str, cfg: Config, *, state_dir: Path, clock: Clock, bus: EventBus,
                providers: Any, tools: ToolRegistry,
                tool_context: Callable[[str, str], ToolContext],
                recorder: Callable[[str, str, dict], None] | None = None,
                store: SessionStore | None = None) -> Agent:
    """Build (or rebuild, keeping ``store``) one agent from config."""
    settings = cfg.agent(agent_id)
    workspace = cfg.workspace_for(agent_id)
    ensure_workspace(workspace)
    if store is None:
        store = SessionStore(state_dir / "agents" / agent_id / "sessions" / "sessions.json",
                             agent_id, clock=clock).load()
    policy = settings.tools
    allowed = tools.allowed(policy.allow, policy.deny)
    prompt = PromptBuilder(
        identity=Identity(agent_id, settings.name), workspace=workspace,
        tool_lines=[f"- {t.name}: {t.description}" for t in allowed],
        bootstrap_max_chars=settings.bootstrap_max_chars, clock=clock)
    caller = ModelCaller(providers, primary=settings.model_primary,
                         fallbacks=settings.model_fallbacks,
                         timeout=settings.model_timeout or cfg.models.timeout,
                         retries=cfg.models.retries, backoff=cfg.models.retry_backoff,
                         clock=clock, media=media_policy(cfg, workspace))
    runner = AgentRunner(agent_id=agent_id, settings=settings, prompt=prompt, tools=tools,
                         caller=caller, bus=bus, clock=clock, recorder=recorder,
                         tool_context=lambda key: tool_context(agent_id, key))
    return Agent(agent_id, settings, workspace, store, prompt, runner)
