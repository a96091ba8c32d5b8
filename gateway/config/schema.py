"""The config schema: every option of config.yaml with its default.

Sections and names follow issue 2's fixed interface (``gateway``, ``logging``, ``models``,
``agents``, ``session``, ``messages``, ``channels``, ``bindings``) plus ``lanes``, ``cron``,
``memory`` and ``timeline``. Loading, ``${ENV}`` substitution and error reporting live in
``gateway.config.load``. Keys are snake_case; OpenClaw-style camelCase aliases are accepted.
"""


from pathlib import Path
from typing import Self

from pydantic import Field, model_validator

from channels.config import ChannelsConfig
from gateway.backup.config import BackupSection
from gateway.cluster.config import ClusterSection
from gateway.config.agents import AgentSettings, AgentsSection, _deep_merge
from gateway.config.gateway_section import (  # noqa: F401 - re-exported
    DEFAULT_PORT,
    DEFAULT_STATE_DIR,
    GatewaySection,
)
from gateway.config.hooks import HookConfig, hooks_problem
from gateway.config.models import ModelsSection
from gateway.config.policy_keys import did_you_mean, policy_key_problem
from gateway.config.sections import (
    Binding,
    ConfigSection,
    CronSection,
    LanesSection,
    LoggingSection,
    MemorySection,
    MessagesSection,
    MetricsSection,
    MonitoringSection,
    SessionSection,
    TimelineSection,
)
from runtime.config_types import ConfigModel, Lazy, section
from runtime.mcp.config import McpSection
from runtime.media.config import MediaSettings
from runtime.skills.config import SkillsSection
from runtime.storage.config import StorageSection
from runtime.telemetry.config import TelemetrySection
from runtime.tools.config import ToolsSection
from runtime.usage.config import BudgetsSection, Price


class Config(ConfigModel):
    """The whole validated config."""

    gateway: Lazy[GatewaySection] = Field(
        section(),
        description="The daemon itself: state directory, control API address and token, shutdown.")
    logging: Lazy[LoggingSection] = Field(
        section(),
        description=("The structured log: level, stderr format and rotation of "
                     "<state_dir>/logs/gateway.jsonl."))
    models: Lazy[ModelsSection] = Field(
        section(),
        description="Model providers, retries, failover cooldowns and timeouts of model calls.")
    agents: Lazy[AgentsSection] = Field(
        section(),
        description="The agents: shared defaults and the list of agents that override them.")
    session: Lazy[SessionSection] = Field(
        section(),
        description="How conversations map to sessions and when a session starts afresh.")
    messages: Lazy[MessagesSection] = Field(
        section(),
        description=("What happens to a message while its session is busy, typing indicators and "
                     "acknowledgement reactions."))
    lanes: Lazy[LanesSection] = Field(
        section(),
        description=("global concurrency caps per lane kind (protect the host; sized for I/O-bound"
                     " turns)"))
    channels: Lazy[ChannelsConfig] = Field(
        section(),
        description="The chat platforms and local surfaces tidegate listens on.")
    bindings: list[Binding] = Field(
        [],
        description=("route messages to agents; the most specific match wins (peer/group > account"
                     " > channel)"))
    cron: Lazy[CronSection] = Field(
        section(),
        description="Scheduled jobs.")
    memory: Lazy[MemorySection] = Field(
        section(),
        description="Memory search.")
    timeline: Lazy[TimelineSection] = Field(
        section(),
        description="The per-session hash-chained timeline.")
    media: Lazy[MediaSettings] = Field(
        section(),
        description="files people send and the agent sends.")
    tools: Lazy[ToolsSection] = Field(
        section(),
        description="the tool policy (7 layers, each can only narrow) and tool settings.")
    mcp: Lazy[McpSection] = Field(
        section(),
        description="Model Context Protocol servers whose tools the agents get.")
    pricing: dict[str, Price] = Field(
        {},
        description=("Prices in USD per million tokens, keyed <provider>/<model> or <model>; adds "
                     "to or overrides the built-in list."))
    budgets: Lazy[BudgetsSection] = Field(
        section(),
        description="Spending caps, checked before every model call.")
    metrics: Lazy[MetricsSection] = Field(
        section(),
        description="The Prometheus endpoint.")
    monitoring: Lazy[MonitoringSection] = Field(
        section(),
        description="The dead-man's switch: a URL pinged while the gateway is healthy.")
    skills: Lazy[SkillsSection] = Field(
        section(),
        description="Where skills come from and how much of the prompt they may take.")
    storage: Lazy[StorageSection] = Field(
        section(),
        description="Where the gateway keeps its stores: files and SQLite, or PostgreSQL.")
    cluster: Lazy[ClusterSection] = Field(
        section(),
        description="replicas; used only with storage.backend postgres.")
    backup: Lazy[BackupSection] = Field(
        section(),
        description="Verified backups of the state dir: where, when and how many to keep.")
    telemetry: Lazy[TelemetrySection] = Field(
        section(),
        description="OpenTelemetry: one trace per turn and the /metrics metrics over OTLP.")
    config: Lazy[ConfigSection] = Field(
        section(),
        description="The last-known-good config and what a start on an invalid file does.")
    hooks: dict[str, HookConfig] = Field(
        {},
        description=("Inbound webhooks by name: a signed POST to /hooks/<name> starts a turn "
                     "in a session (docs: Webhooks)."))

    @model_validator(mode="after")
    def _cross_checks(self) -> Self:
        tr = self.media.audio.transcription
        if tr is not None and (tr.provider not in self.models.providers
                               or self.models.providers[tr.provider].api != "openai"):
            raise ValueError(f"media.audio.transcription.provider: {tr.provider!r} must name "
                             "a models.providers entry with api openai")
        emb = self.memory.embeddings
        if emb is not None and (emb.provider not in self.models.providers
                                or self.models.providers[emb.provider].api != "openai"):
            raise ValueError(f"memory.embeddings.provider: {emb.provider!r} must name a "
                             "models.providers entry with api openai (an OpenAI-compatible "
                             "/v1/embeddings)")
        ids = self.agent_ids()
        for agent_id in self.budgets.per_agent:
            if agent_id.lower() not in ids:
                raise ValueError(f"budgets.per_agent.{agent_id}: unknown agent"
                                 f"{did_you_mean(agent_id.lower(), ids)}")
        target = self.budgets.alert_target
        if target not in ("none", "last") and (len(target.split(":")) < 2 or
                                                self.target_problem(target)):
            raise ValueError(f"budgets.alert_target: {self.target_problem(target) or ''}"
                             f" expected none, last or <channel>:<to>[:<thread>]")
        for agent_id in ids:
            hb = self.agent(agent_id).heartbeat
            if hb is not None and hb.target not in ("none", "last"):
                problem = self.target_problem(hb.target)
                if problem:
                    where = ("agents.defaults" if self.agents.defaults.heartbeat
                             and self.agents.defaults.heartbeat.target == hb.target
                             else f"agents.list.{agent_id}")
                    raise ValueError(f"{where}.heartbeat.target: {problem}")
        links = {str(n).strip().lower() for n in self.session.identity_links}
        for agent_id in ids:
            for i, owner in enumerate(self.agent(agent_id).owners):
                if ":" not in owner and owner.lower() not in links:
                    raise ValueError(
                        f"agents ({agent_id}).owners.{i}: {owner!r} is neither an "
                        "identity-link name (session.identity_links) nor '<channel>:<user "
                        "id>' (display names never count)")
        for i, b in enumerate(self.bindings):
            if b.agent.lower() not in ids:
                raise ValueError(f"bindings.{i}.agent: unknown agent {b.agent!r}"
                                 f"{did_you_mean(b.agent.lower(), ids)}")
        problem = policy_key_problem(self) or hooks_problem(self)
        if problem:
            raise ValueError(problem)
        for agent_id in ids:
            ref = self.agent(agent_id).model_primary
            for r in [ref, *self.agent(agent_id).model_fallbacks]:
                if r is None:
                    continue
                prov = r.split("/", 1)[0]
                if "/" not in r or (prov not in self.models.providers and prov != "echo"):
                    where = "agents.defaults.model" if agent_id == "main" else "agents.list"
                    raise ValueError(
                        f"{where}: model {r!r} must be <provider>/<model> with the provider "
                        f"defined in models.providers (have: "
                        f"{', '.join(sorted(self.models.providers)) or 'none'})"
                    )
        return self

    def target_problem(self, target: str, running: set[str] | None = None) -> str | None:
        """Why a delivery target ``<channel>:<to>[:<thread>]`` cannot work, or None.

        A chat platform must be enabled in this config (and its plugin loaded); any other
        channel name must be in ``running`` (the channels a live gateway has) — without ``running`` it is not
        judged (channels can be registered at run time)."""
        channel = target.split(":", 1)[0].lower()
        section = self.channels.platform(channel) if channel not in (
            "webchat", "cli", "openai", "openai_api") else None
        if section is None:
            failed = _failed_plugin(channel)
            if failed:
                return (f"channel plugin {channel!r} failed to load, nothing can be "
                        f"delivered to it: {failed}")
            if running is not None and channel not in running:
                return (f"unknown channel {channel!r} in {target!r} (running: "
                        f"{', '.join(sorted(running)) or 'none'})")
            return None
        if not getattr(section, "enabled", True):
            return f"channel {channel!r} is not enabled (channels.{channel}.enabled)"
        return None

    def agent_ids(self) -> list[str]:
        """Configured agent ids; ``["main"]`` when ``agents.list`` is empty."""
        return [e.id for e in self.agents.list] or ["main"]

    def default_agent(self) -> str:
        return self.agent_ids()[0]

    def agent(self, agent_id: str) -> AgentSettings:
        """Settings for ``agent_id``: defaults deep-merged with its list entry.

        Raises KeyError for an unknown id.
        """
        cache = self.__dict__.setdefault("_agent_cache", {})
        if agent_id in cache:
            return cache[agent_id]
        base = self.agents.defaults.model_dump(exclude_unset=False, by_alias=False)
        entry = next((e for e in self.agents.list if e.id == agent_id), None)
        if entry is None and (self.agents.list or agent_id != "main"):
            raise KeyError(f"unknown agent {agent_id!r}")
        overrides = entry.overrides() if entry else {}
        merged = _deep_merge(base, overrides)
        merged["id"] = agent_id
        settings = AgentSettings.model_validate(merged)
        cache[agent_id] = settings
        return settings

    def vision_settings(self) -> dict[str, bool]:
        """Explicit ``models.providers.<p>.models.<m>.vision`` settings by ``p/m`` ref."""
        return {f"{p}/{m}": o.vision for p, prov in self.models.providers.items()
                for m, o in prov.models.items() if o.vision is not None}

    def workspace_for(self, agent_id: str) -> Path:
        ws, state_dir = self.agent(agent_id).workspace, self.gateway.state_dir
        cache = self.__dict__.setdefault("_workspace_cache", {})  # every turn asks
        path = cache.get((agent_id, ws, state_dir))
        if path is None:
            path = cache[(agent_id, ws, state_dir)] = (
                Path(ws).expanduser() if ws else
                self.gateway.state_path / "workspace" / agent_id)
        return path


def _failed_plugin(channel: str) -> str | None:
    """The load error of the installed channel plugin ``channel`` that failed to load
    (import error, another SDK major, not a ChannelPlugin), else None."""
    from channels import registry
    from runtime import plugins
    info = plugins.find("channel", channel)
    if info is None or registry.channel_plugin(channel) is not None:
        return None
    return info.error or "it failed to load"
