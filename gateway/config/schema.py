"""The config schema: every option of config.yaml with its default.

Sections and names follow issue 2's fixed interface (``gateway``, ``logging``, ``models``,
``agents``, ``session``, ``messages``, ``channels``, ``bindings``) plus ``lanes``, ``cron``,
``memory`` and ``timeline``. Loading, ``${ENV}`` substitution and error reporting live in
``gateway.config.load``. Keys are snake_case; OpenClaw-style camelCase aliases are accepted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_snake

from channels.config import ChannelsConfig
from gateway.cluster.config import ClusterSection
from gateway.config.gateway_section import (  # noqa: F401 - re-exported
    DEFAULT_PORT,
    DEFAULT_STATE_DIR,
    GatewaySection,
)
from runtime.config_types import ConfigModel, Duration, format_validation_error
from runtime.context_guard import ContextGuard
from runtime.mcp.config import McpSection
from runtime.media.config import MediaSettings
from runtime.providers.failover.config import (
    AuthProfileConfig,
    Cooldowns,
    check_profiles,
)
from runtime.skills.config import SkillsSection
from runtime.storage.config import StorageSection
from runtime.subagents.config import SubagentSettings
from runtime.tool_loop import ToolLoopConfig
from runtime.tools.config import AgentToolRules, ToolsSection
from runtime.usage.config import BudgetsSection, Price
from scheduler.heartbeat_rules import parse_hhmm


class LoggingSection(ConfigModel):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"
    max_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    backups: int = Field(5, ge=0)


class ModelOptions(ConfigModel):
    vision: bool | None = None  # None: built-in guess (runtime/media/vision.py)
    context_window: int | None = Field(None, ge=1)  # None: runtime/context_guard.py table


class ProviderConfig(ConfigModel):
    api: Literal["openai", "anthropic"]
    base_url: str | None = None
    api_key: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    models: dict[str, ModelOptions] = Field(default_factory=dict)
    max_concurrent: int | None = Field(None, ge=1)  # model calls in flight; None = unlimited
    auth_profiles: list[AuthProfileConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _profiles(self) -> ProviderConfig:
        check_profiles(self.auth_profiles, self.api_key)
        return self


class ModelsSection(ConfigModel):
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    timeout: Duration = 120.0
    retries: int = Field(2, ge=0, le=10)
    retry_backoff: Duration = 1.0
    max_attempts: int = Field(160, ge=1)
    max_retry_wait: Duration = 60.0
    cooldowns: Cooldowns = Field(default_factory=Cooldowns)


class ModelRef(ConfigModel):
    primary: str
    fallbacks: list[str] = Field(default_factory=list)


def _check_tz(v: str) -> str:
    from zoneinfo import ZoneInfo

    try:
        ZoneInfo(v)
    except Exception:  # noqa: BLE001 - zoneinfo raises several types
        raise ValueError(f"unknown IANA timezone {v!r}") from None
    return v


class ActiveHours(ConfigModel):
    start: str = "00:00"
    end: str = "24:00"
    timezone: str = "user"

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return v if v == "user" else _check_tz(v)

    @field_validator("start")
    @classmethod
    def _start(cls, v: str) -> str:
        parse_hhmm(str(v))  # 00:00-23:59; "24:00" is an end only
        return str(v).strip()

    @field_validator("end")
    @classmethod
    def _end(cls, v: str) -> str:
        parse_hhmm(str(v), allow_24=True)  # "24:00" = midnight at the end of the day
        return str(v).strip()


class HeartbeatConfig(ConfigModel):
    every: Duration = 1800.0
    prompt: str | None = None
    target: str = "none"
    model: str | None = None
    session: str | None = None
    active_hours: ActiveHours | None = None
    ack_max_chars: int = Field(300, ge=0)
    timeout: Duration | None = None

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        parts = v.split(":")
        if v not in ("none", "last") and (len(parts) < 2 or not parts[0] or not parts[1]):
            raise ValueError("expected none, last or <channel>:<to>[:<thread>]")
        return v

    @field_validator("session")
    @classmethod
    def _session(cls, v: str | None) -> str | None:
        if v is not None and v != "main" and not v.lower().startswith("agent:"):
            raise ValueError("expected main or a session key agent:<agent>:...")
        return v


ToolPolicy = AgentToolRules  # agents.*.tools (policy layers 5 and 6)


class CompactionConfig(ConfigModel):
    enabled: bool = True
    threshold: float = Field(0.8, gt=0.0, le=1.0)
    keep_ratio: float = Field(0.4, gt=0.0, lt=1.0)


class ExecConfig(ConfigModel):
    timeout: Duration = 60.0
    max_output_chars: int = Field(20_000, ge=100)
    background_max: int = Field(8, ge=0)


class AgentSettings(ConfigModel):
    """One agent's settings: ``agents.defaults`` merged with its ``agents.list`` entry."""

    id: str = "main"
    name: str | None = None
    model: str | ModelRef | None = None
    workspace: str | None = None
    timeout: Duration = 600.0
    model_timeout: Duration | None = None
    tool_timeout: Duration = 120.0
    user_timezone: str = "UTC"
    context_tokens: int = Field(128_000, ge=1024)
    history_turns: int = Field(50, ge=0)  # the model sees the newest N user turns; 0 = all
    max_tokens: int = Field(4096, ge=1)
    temperature: float | None = None
    max_tool_rounds: int = Field(40, ge=1)
    bootstrap_max_chars: int = Field(20_000, ge=0)
    tools: ToolPolicy = Field(default_factory=ToolPolicy)
    subagents: SubagentSettings = Field(default_factory=SubagentSettings)
    exec: ExecConfig = Field(default_factory=ExecConfig)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    heartbeat: HeartbeatConfig | None = None
    context_guard: ContextGuard = Field(default_factory=ContextGuard)
    tool_loop: ToolLoopConfig = Field(default_factory=ToolLoopConfig)

    @field_validator("user_timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return _check_tz(v)

    @property
    def model_primary(self) -> str | None:
        return self.model.primary if isinstance(self.model, ModelRef) else self.model

    @property
    def model_fallbacks(self) -> list[str]:
        return list(self.model.fallbacks) if isinstance(self.model, ModelRef) else []


class AgentDefaults(AgentSettings):
    id: str = "main"


class AgentEntry(ConfigModel):
    """An ``agents.list`` item: ``id`` plus any defaults key to override (checked on merge)."""

    model_config = ConfigDict(**{**ConfigModel.model_config, "extra": "allow"})
    id: str

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        # Ids name directories (agents/<id>/, workspace/<id>/): no separators, no "..".
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", v or ""):
            raise ValueError("agent id must be 1-64 letters, digits, '-' or '_' "
                             "(it names directories)")
        return v.lower()

    def overrides(self) -> dict[str, Any]:
        """The entry's keys in snake_case (camelCase aliases converted), ``id`` included."""
        return _snake_keys(self.model_dump(by_alias=False))


AgentList = list[AgentEntry]  # named outside: the field "list" shadows the builtin


class AgentsSection(ConfigModel):
    defaults: AgentDefaults = Field(default_factory=AgentDefaults)
    list: AgentList = Field(default_factory=list)

    @model_validator(mode="after")
    def _entries_valid(self) -> AgentsSection:
        seen: set[str] = set()
        problems: list[str] = []
        base = self.defaults.model_dump(by_alias=False)
        for i, entry in enumerate(self.list):
            if entry.id in seen:
                problems.append(f"list.{i}.id: duplicate agent id {entry.id!r}")
            seen.add(entry.id)
            try:
                AgentSettings.model_validate(_deep_merge(base, entry.overrides()))
            except ValidationError as exc:
                problems += [f"list.{i}.{line}" for line in format_validation_error(exc)]
        if problems:
            raise ValueError("\n".join(problems))
        return self


class ResetPolicy(ConfigModel):
    mode: Literal["none", "daily", "idle"] = "none"
    at_hour: int = Field(4, ge=0, le=23)
    idle_minutes: int = Field(60, ge=1)


class SessionSection(ConfigModel):
    dm_scope: Literal["main", "per-peer", "per-channel-peer", "per-account-channel-peer"] = (
        "per-channel-peer"
    )
    identity_links: dict[str, list[str]] = Field(default_factory=dict)
    reset: ResetPolicy = Field(default_factory=ResetPolicy)

    @field_validator("identity_links")
    @classmethod
    def _distinct_people(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        # A canonical name is one person's peer id in session keys (lower-cased there).
        seen: dict[str, str] = {}
        for name in v:
            other = seen.setdefault(name.strip().lower(), name)
            if other != name:
                raise ValueError(f"{other!r} and {name!r} differ only in case")
        return v


class QueueConfig(ConfigModel):
    mode: Literal["followup", "collect", "steer", "interrupt"] = "collect"
    debounce: Duration = 1.0
    cap: int = Field(50, ge=1)


class MessagesSection(ConfigModel):
    queue: QueueConfig = Field(default_factory=QueueConfig)
    typing_interval: Duration = 4.0
    # issue 13: reactions on the triggering message (gateway/outbound/reactions.py)
    ack_reaction: str = "👀"
    done_reaction: str | None = None
    ack_reaction_scope: Literal["all", "group-mentions", "dms", "off"] = "group-mentions"


class LanesSection(ConfigModel):
    main: int = Field(32, ge=1)
    cron: int = Field(4, ge=1)
    subagent: int = Field(16, ge=1)


class BindingMatch(ConfigModel):
    channel: str | None = None
    account: str | None = None
    peer: str | None = None
    group: str | None = None
    chat_type: Literal["dm", "group", "channel", "thread"] | None = None


class Binding(ConfigModel):
    agent: str
    match: BindingMatch = Field(default_factory=BindingMatch)


class CronSection(ConfigModel):
    enabled: bool = True
    catch_up: Duration = 3600.0
    timeout: Duration = 600.0
    agent_timeout: Duration = 3600.0


class MemorySection(ConfigModel):
    time_decay_lambda: float = Field(0.0, ge=0.0)


class TimelineSection(ConfigModel):
    enabled: bool = True
    backend: Literal["sqlite"] = "sqlite"
    path: str | None = None


class MetricsSection(ConfigModel):
    """``GET /metrics``: needs the gateway token unless ``public_loopback`` (the server
    only listens on loopback, so this opens it to local scrapers only)."""

    enabled: bool = True
    public_loopback: bool = False


class Config(ConfigModel):
    """The whole validated config."""

    gateway: GatewaySection = Field(default_factory=GatewaySection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    models: ModelsSection = Field(default_factory=ModelsSection)
    agents: AgentsSection = Field(default_factory=AgentsSection)
    session: SessionSection = Field(default_factory=SessionSection)
    messages: MessagesSection = Field(default_factory=MessagesSection)
    lanes: LanesSection = Field(default_factory=LanesSection)
    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)
    bindings: list[Binding] = Field(default_factory=list)
    cron: CronSection = Field(default_factory=CronSection)
    memory: MemorySection = Field(default_factory=MemorySection)
    timeline: TimelineSection = Field(default_factory=TimelineSection)
    media: MediaSettings = Field(default_factory=MediaSettings)
    tools: ToolsSection = Field(default_factory=ToolsSection)
    mcp: McpSection = Field(default_factory=McpSection)
    pricing: dict[str, Price] = Field(default_factory=dict)
    budgets: BudgetsSection = Field(default_factory=BudgetsSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    skills: SkillsSection = Field(default_factory=SkillsSection)
    storage: StorageSection = Field(default_factory=StorageSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        tr = self.media.audio.transcription
        if tr is not None and (tr.provider not in self.models.providers
                               or self.models.providers[tr.provider].api != "openai"):
            raise ValueError(f"media.audio.transcription.provider: {tr.provider!r} must name "
                             "a models.providers entry with api openai")
        ids = self.agent_ids()
        for agent_id in self.budgets.per_agent:
            if agent_id.lower() not in ids:
                raise ValueError(f"budgets.per_agent.{agent_id}: unknown agent")
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
        for i, b in enumerate(self.bindings):
            if b.agent.lower() not in ids:
                raise ValueError(f"bindings.{i}.agent: unknown agent {b.agent!r}")
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

        A chat platform must be enabled in this config; any other channel name must be in
        ``running`` (the channels a live gateway has) — without ``running`` it is not
        judged (channels can be registered at run time)."""
        channel = target.split(":", 1)[0].lower()
        if channel not in ("telegram", "slack", "discord"):
            if running is not None and channel not in running:
                return (f"unknown channel {channel!r} in {target!r} (running: "
                        f"{', '.join(sorted(running)) or 'none'})")
            return None
        if not getattr(self.channels, channel).enabled:
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
        ws = self.agent(agent_id).workspace
        if ws:
            return Path(ws).expanduser()
        return self.gateway.state_path / "workspace" / agent_id


def _snake_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {to_snake(k) if isinstance(k, str) else k: _snake_keys(v) for k, v in value.items()}
    return value


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out
