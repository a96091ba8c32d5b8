"""Gateway services behind the tools: the policy built from config (with its load-time
diagnostics), each agent's skill catalog, and channel actions for the channel tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from gateway.config.schema import Config
from gateway.tools.policy import build_policy, diagnostics
from runtime.clock import Clock
from runtime.skills.catalog import SkillCatalog, SkillLimits
from runtime.tools.policy import ToolPolicy, ToolScope
from runtime.tools.registry import ToolRegistry
from runtime.tools.sources import builtin_registry
from runtime.tools.web.tools import WEB_TOOLS

log = structlog.get_logger(__name__)


def gateway_registry(cfg: Config) -> ToolRegistry:
    """The built-in tools, the enabled web tools (``tools.web.fetch/search.enabled``), and
    a declared plugin slot ``mcp:<server>`` per configured MCP server (its tools register
    when it connects), and the tools of the installed tool plugins (``plugin:<name>``)."""
    registry = builtin_registry()
    apply_web_tools(registry, cfg)
    for server in cfg.mcp.servers:
        registry.declare_plugin(f"mcp:{server}")
    from runtime.tools.plugins import register_tool_plugins
    register_tool_plugins(registry)  # the tidegate.tools entry points
    _react_on_plugin_channels(registry)
    return registry


def apply_web_tools(registry: ToolRegistry, cfg: Config) -> None:
    """Offer exactly the enabled web tools (``tools.web.fetch/search.enabled``): at start,
    and again on a config reload (the policy and the agents' tool lists are rebuilt
    after it)."""
    on = {"web_fetch": cfg.tools.web.fetch.enabled, "web_search": cfg.tools.web.search.enabled}
    for tool in WEB_TOOLS:
        if on[tool.name]:
            registry.register(tool)
        else:
            registry.unregister(tool.name)


def _react_on_plugin_channels(registry: ToolRegistry) -> None:
    """The ``react`` tool also in turns of channel plugins that declare ``reactions``
    (channels/sdk.py ``Capabilities``); their adapter's ``act`` runs it."""
    from dataclasses import replace

    from channels import registry as channel_plugins
    react = registry.get("react")
    extra = {name for name, p in channel_plugins.channel_plugins().items()
             if p.capabilities.reactions}
    if react is not None and react.platforms is not None and not extra <= react.platforms:
        registry.register(replace(react, platforms=react.platforms | extra))


def policy_with_diagnostics(cfg: Config, registry: ToolRegistry,
                            old: ToolPolicy | None = None) -> tuple[ToolPolicy, list[str]]:
    """A fresh cached policy for ``cfg`` (replacing ``old``) and the unknown-entry
    diagnostics, each logged once as a WARNING ``tool_policy_unknown_entry``."""
    if old is not None:
        old.detach()
    problems = diagnostics(cfg, registry)
    for line in problems:
        log.warning("tool_policy_unknown_entry", problem=line)
    return build_policy(cfg, registry), problems


def managed_skills_dir(cfg: Config, state_dir: Path) -> Path:
    """``skills.managed_dir`` or ``<state_dir>/skills``."""
    managed = cfg.skills.managed_dir
    return Path(managed).expanduser() if managed else state_dir / "skills"


def skill_catalog(cfg: Config, agent_id: str, state_dir: Path, clock: Clock) -> SkillCatalog:
    """The six skill sources of ``agent_id`` with the configured budget."""
    s = cfg.skills
    return SkillCatalog.for_workspace(
        cfg.workspace_for(agent_id), extra=[Path(d).expanduser() for d in s.extra_dirs],
        managed=managed_skills_dir(cfg, state_dir),
        personal=Path(s.personal_dir).expanduser() if s.personal_dir else None,
        bundled=s.bundled, now=clock.time,
        limits=SkillLimits(s.max_skills, s.max_prompt_chars, s.max_file_bytes))


async def channel_action(gw: Any, scope: ToolScope, action: str, args: dict[str, Any]) -> str:
    """Run a channel tool's ``action`` through the adapter of the turn's channel account.
    Adapters opt in with ``async act(action, route, args) -> str``. Raises RuntimeError."""
    route = scope.route
    channel = gw.deliverer.find(route.channel, route.account)
    act = getattr(channel, "act", None)
    if act is None:
        raise RuntimeError(f"the {route.channel} adapter does not support {action}")
    result = await act(action, route, args)
    log.info("channel_action", channel=route.channel, action=action, to=route.to)
    return result


def warn_sandbox_limits(cfg: Config) -> str | None:
    """One WARNING ``sandbox_no_process_limit`` when some agent's commands run in bwrap
    while no pids cgroup can be made and the gateway runs as root (the kernel does not
    apply RLIMIT_NPROC to root: a fork bomb would not stop at ``max_processes``).
    Returns the message (None when the limit holds)."""
    import os

    from runtime.sandbox.limits import pids_base
    on = [a for a in cfg.agent_ids() if cfg.agent(a).sandbox.mode != "off"
          and cfg.agent(a).sandbox.backend == "bwrap"]
    if not on or os.geteuid() != 0 or pids_base() is not None:
        return None
    msg = ("sandboxed commands have no process limit: the gateway runs as root and no "
           "pids cgroup is writable (run it as an ordinary user, or delegate a cgroup)")
    log.warning("sandbox_no_process_limit", agents=on, problem=msg)
    return msg


async def remove_stale_sandboxes(cfg: Config, state_dir: Any) -> list[str]:
    """At start, before any command can run: when some agent's commands run in Docker,
    remove the containers a previous run with this state dir left behind (a gateway
    killed with ``kill -9`` never removes its own; runtime/sandbox/docker.py). Returns
    their ids; never raises."""
    from runtime.sandbox.docker import owner_id, remove_stale_containers
    if not any(cfg.agent(a).sandbox.mode != "off" and cfg.agent(a).sandbox.backend == "docker"
               for a in cfg.agent_ids()):
        return []
    return await remove_stale_containers(owner_id(state_dir))
