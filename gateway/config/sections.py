"""The small top-level sections of config.yaml: ``logging``, ``session``, ``messages``,
``lanes``, ``bindings``, ``cron``, ``memory``, ``timeline``, ``metrics`` and
``monitoring``."""


from typing import Literal

from pydantic import Field, field_validator

from runtime.config_types import ConfigModel, Duration, section


class LoggingSection(ConfigModel):
    level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="debug | info | warning | error.")
    format: Literal["auto", "json", "console"] = Field(
        "auto",
        description=("auto (console on a TTY, JSON otherwise) | json | console — stderr only; the "
                     "file is always JSON."))
    max_bytes: int = Field(10 * 1024 * 1024, ge=1024,
        description="rotate <state_dir>/logs/gateway.jsonl at this size.")
    backups: int = Field(5, ge=0,
        description="rotated files kept.")


class ResetPolicy(ConfigModel):
    mode: Literal["none", "daily", "idle"] = Field(
        "none",
        description="none | daily | idle — only user messages count as activity.")
    at_hour: int = Field(4, ge=0, le=23,
        description=("daily: local hour (user_timezone) after which the next message starts a new "
                     "session."))
    idle_minutes: int = Field(60, ge=1,
        description="idle: minutes without a user message.")


class SessionSection(ConfigModel):
    dm_scope: Literal["main", "per-peer", "per-channel-peer", "per-account-channel-peer"] = (
        Field(
        "per-channel-peer",
        description="main | per-peer | per-channel-peer | per-account-channel-peer.")
    )
    identity_links: dict[str, list[str]] = Field(
        {},
        description=("one person's ids on several platforms -> one peer, e.g. {alice: "
                     "[\"telegram:123\", \"discord:456\"]} ids compare case-sensitively except on "
                     "telegram/discord/slack; names are case-insensitive."))
    reset: ResetPolicy = Field(
        section(),
        description="When a conversation starts a new session on its own.")

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
    mode: Literal["followup", "collect", "steer", "interrupt"] = Field(
        "collect",
        description=("what a message does while its session is busy: followup | collect | steer | "
                     "interrupt."))
    debounce: Duration = Field(
        1.0,
        description=("collect: a batch collected while busy starts this long after its last "
                     "message."))
    cap: int = Field(50, ge=1,
        description="followup: queued turns per session before further messages merge.")


class MessagesSection(ConfigModel):
    queue: QueueConfig = Field(
        section(),
        description=("a message to an IDLE session always starts at once (see "
                     "channels.<p>.debounce)"))
    typing_interval: Duration = Field(
        4.0,
        description="how often the typing indicator is refreshed while a turn runs.")
    # issue 13: reactions on the triggering message (gateway/outbound/reactions.py)
    ack_reaction: str = Field(
        "👀",
        description=("set on the triggering message when its turn starts, removed when it ends (\"\""
                     " = off)"))
    done_reaction: str | None = Field(
        None,
        description="set when the turn ends, e.g. \"✅\" (null = none); never after a silent reply.")
    ack_reaction_scope: Literal["all", "group-mentions", "dms", "off"] = Field(
        "group-mentions",
        description="where both reactions apply: all | group-mentions (group turns) | dms | off.")


class LanesSection(ConfigModel):
    main: int = Field(32, ge=1,
        description="User turns running at once, all sessions together.")
    cron: int = Field(4, ge=1,
        description="Isolated cron runs at once.")
    subagent: int = Field(16, ge=1,
        description="Subagent runs at once.")


class BindingMatch(ConfigModel):
    channel: str | None = Field(
        None,
        description="Channel name (telegram, slack, discord, webchat, ...).")
    account: str | None = Field(
        None,
        description="Account id within the channel.")
    peer: str | None = Field(
        None,
        description="Sender id (a DM peer).")
    group: str | None = Field(
        None,
        description="Group, channel or chat id.")
    chat_type: Literal["dm", "group", "channel", "thread"] | None = Field(
        None,
        description="dm | group | channel | thread.")


class Binding(ConfigModel):
    agent: str = Field(
        description="The agent that answers matching messages.")
    match: BindingMatch = Field(
        section(),
        description="What a message must match; unset keys match anything.")


class CronSection(ConfigModel):
    enabled: bool = Field(
        True,
        description="Run the cron service.")
    catch_up: Duration = Field(
        3600.0,
        description=("runs missed while the gateway was down are caught up once if within this "
                     "window."))
    timeout: Duration = Field(
        600.0,
        description="default timeout of a main-session job.")
    agent_timeout: Duration = Field(
        3600.0,
        description="default timeout of an isolated agent-turn job.")


class EmbeddingsConfig(ConfigModel):
    """``memory.embeddings``: semantic memory search through an OpenAI-compatible
    ``/v1/embeddings`` of a configured provider (its base_url and auth profiles)."""

    provider: str = Field(description="A models.providers key (api: openai) whose "
                          "base_url serves /embeddings.")
    model: str = Field(description="The embedding model id, e.g. text-embedding-3-small.")
    dimensions: int | None = Field(None, ge=1, le=8192, description=(
        "Ask for vectors of this size (models that support it); None: the model's."))
    batch_size: int = Field(64, ge=1, le=2048, description="Texts per request.")
    timeout: Duration = Field(30.0, description="Seconds per embeddings request.")
    min_similarity: float = Field(0.2, ge=-1.0, le=1.0, description=(
        "Cosine similarity a paragraph needs to enter the vector list (unrelated "
        "paragraphs are left to BM25); -1 keeps every paragraph."))

    @field_validator("provider", "model")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value.strip()


class MemorySection(ConfigModel):
    time_decay_lambda: float = Field(0.0, ge=0.0, description=(
        "Time decay per hour: score × exp(-λ·Δt_hours); 0 = no decay."))
    embeddings: EmbeddingsConfig | None = Field(None, description=(
        "Semantic search; None (default): BM25 + decay only, offline."))
    rrf_k: int = Field(60, ge=1, description="Reciprocal-rank-fusion constant k.")
    index_transcripts: bool = Field(False, description=(
        "Also search the agent's DM transcripts, each in the scope of the person the DM "
        "is with (group transcripts are never indexed)."))
    candidates: int = Field(50, ge=1, le=1000, description=(
        "How many results of each of BM25 and vector search are fused."))
    group_writes: bool = Field(False, description=(
        "Whether memory_write may write a group's shared scope (scope 'group')."))


class TimelineSection(ConfigModel):
    enabled: bool = Field(
        True,
        description="keep the irreversible hash-chained per-session timeline.")
    backend: Literal["sqlite"] = Field(
        "sqlite",
        description=("Where timelines are kept on embedded storage (storage.backend postgres keeps"
                     " them in PostgreSQL)."))
    path: str | None = Field(
        None,
        description="default <state_dir>/timeline.db.")


class MetricsSection(ConfigModel):
    """``GET /metrics``: needs the gateway token unless ``public_loopback`` (the server
    only listens on loopback, so this opens it to local scrapers only)."""

    enabled: bool = Field(
        True,
        description="GET /metrics (Prometheus text format)")
    public_loopback: bool = Field(
        False,
        description="true: no token needed (the server listens on loopback only)")


class MonitoringSection(ConfigModel):
    """The dead-man's switch (healthchecks-style, docs/monitoring.md): the gateway GETs
    ``ping_url`` every ``ping_every`` while it, its heartbeat, its cron service and every
    enabled channel are healthy, and ``<ping_url>/fail?reason=...`` when one is not."""

    ping_url: str | None = Field(None, description="URL to GET while healthy (e.g. "
                                 "https://hc-ping.com/<uuid>); None: no pings")
    ping_every: Duration = Field(60.0, gt=0, description="seconds between pings")
    ping_timeout: Duration = Field(10.0, gt=0, description="seconds one ping may take")

    @field_validator("ping_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/") if v else None


class ConfigSection(ConfigModel):
    """``config``: the last-known-good config (gateway/config/lkg.py)."""

    lkg_after: Duration = Field(60.0, description="a config that loaded and served this "
                                "long (seconds or 30s/5m) is kept as "
                                "<state_dir>/config.lkg.yaml; 0 = never keep one")
    on_invalid: Literal["refuse", "lkg"] = Field(
        "refuse", description="a start whose config fails validation: refuse (exit 2) or "
        "lkg (start on the last-known-good config, with a problem in status)")
