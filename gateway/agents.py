"""Per-agent runtime objects built from config: workspace, session store, prompt builder,
model chain and turn runner (one of each per agent, built once at start and on reload)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config.agents import AgentSettings
from gateway.config.schema import Config
from gateway.sessions.store import SessionStore, open_session_store, session_db_path
from gateway.tools.policy import provider_of
from runtime.clock import Clock
from runtime.context.guard import ContextWindowGuard
from runtime.events import EventBus
from runtime.media.vision import MediaPolicy
from runtime.prompt import Identity, PromptBuilder, ensure_workspace
from runtime.providers.failover.chain import ModelCaller
from runtime.providers.failover.profiles import AuthProfiles, FailoverSettings
from runtime.tool_loop import LoopBreaker
from runtime.tools.policy import ToolPolicy, ToolScope
from runtime.tools.registry import ToolContext
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
    provider: str = "echo"  # provider name of the primary model (tool policy scope)
    skills: Any = None  # runtime.skills.catalog.SkillCatalog
    api: str = "echo"  # the primary provider's API: openai | anthropic | echo (/think)


def media_policy(cfg: Config, workspace: Path) -> MediaPolicy:
    """Image handling for one agent's model calls (``media.image``, per-model vision)."""
    img = cfg.media.image
    return MediaPolicy(workspace=workspace, max_side=img.max_side, keep_turns=img.keep_turns,
                       vision=cfg.vision_settings(),
                       apis={n: p.api for n, p in cfg.models.providers.items()})


def session_sees_images(agents: dict[str, Agent], agent_id: str, session_key: str) -> bool:
    """Whether the model a turn of ``session_key`` would call first now (its ``/model``
    override, else the agent's chain after cooling profiles) takes images: intake encodes
    images ahead only then."""
    agent = agents.get(agent_id)
    if agent is None:
        return True
    entry = agent.store.get(session_key)
    return agent.runner.caller.sees_images(entry.model_override if entry else None)


def build_agent(agent_id: str, cfg: Config, *, state_dir: Path, clock: Clock, bus: EventBus,
                providers: Any, tools: ToolPolicy,
                tool_context: Callable[..., ToolContext],
                recorder: Callable[[str, str, dict], None] | None = None,
                store: SessionStore | None = None, profiles: AuthProfiles | None = None,
                breaker: LoopBreaker | None = None,
                gate: Callable[[str, str], str | None] | None = None,
                batching: Any = None, skills: Any = None) -> Agent:
    """Build (or rebuild, keeping ``store``) one agent from config. ``profiles`` and
    ``breaker`` are gateway-wide (auth-profile state, tool-loop breaker); ``gate``: see
    AgentRunner (checked before every model call); ``batching`` holds a turn's timeline
    events until its durability points."""
    settings = cfg.agent(agent_id)
    workspace = cfg.workspace_for(agent_id)
    ensure_workspace(workspace)
    if store is None:
        store = open_session_store(session_db_path(state_dir, agent_id), agent_id,
                                   clock=clock)
    # The tools reach the model as tool specs, narrowed per turn by the policy; the
    # prompt's tool guidance does not list them (it would differ per chat).
    prompt = PromptBuilder(
        identity=Identity(agent_id, settings.name), workspace=workspace, tool_lines=[],
        bootstrap_max_chars=settings.bootstrap_max_chars, clock=clock,
        skills=skills)
    caller = ModelCaller(providers, primary=settings.model_primary,
                         fallbacks=settings.model_fallbacks,
                         timeout=settings.model_timeout or cfg.models.timeout,
                         profiles=profiles, agent_id=agent_id, clock=clock,
                         media=media_policy(cfg, workspace))
    where = f"agents.list.{agent_id}" if cfg.agents.list else "agents.defaults"
    guard = ContextWindowGuard(cfg.models.providers, fallback=settings.context_tokens,
                               guard=settings.context_guard, where=where)
    base_scope = ToolScope(agent_id, provider_of(cfg, agent_id))
    runner = AgentRunner(agent_id=agent_id, settings=settings, prompt=prompt,
                         tools=lambda inp: tools.resolve(inp.tool_scope or base_scope),
                         caller=caller, bus=bus, clock=clock, recorder=recorder,
                         tool_context=lambda key, stranger=None: tool_context(
                             agent_id, key, stranger=stranger), guard=guard,
                         breaker=breaker, gate=gate, batching=batching)
    provider = cfg.models.providers.get(base_scope.provider)
    return Agent(agent_id, settings, workspace, store, prompt, runner, base_scope.provider,
                 prompt.skills, provider.api if provider is not None else "echo")


def failover_settings(cfg: Config) -> FailoverSettings:
    """The ``models.*`` retry/failover knobs as the failover package takes them."""
    m = cfg.models
    return FailoverSettings(max_attempts=m.max_attempts, max_retry_wait=m.max_retry_wait,
                            retries=m.retries, backoff=m.retry_backoff,
                            cooldowns=m.cooldowns.model_dump())


def provider_dicts(cfg: Config) -> dict[str, dict[str, Any]]:
    """``models.providers`` as plain dicts (the registry's and the profiles' input)."""
    return {n: p.model_dump() for n, p in cfg.models.providers.items()}
