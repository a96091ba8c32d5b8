"""The small top-level sections of config.yaml: ``logging``, ``session``, ``messages``,
``lanes``, ``bindings``, ``cron``, ``memory``, ``timeline`` and ``metrics`` (issue 2)."""


from typing import Literal

from pydantic import Field, field_validator

from runtime.config_types import ConfigModel, Duration, section


class LoggingSection(ConfigModel):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"
    max_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    backups: int = Field(5, ge=0)


class ResetPolicy(ConfigModel):
    mode: Literal["none", "daily", "idle"] = "none"
    at_hour: int = Field(4, ge=0, le=23)
    idle_minutes: int = Field(60, ge=1)


class SessionSection(ConfigModel):
    dm_scope: Literal["main", "per-peer", "per-channel-peer", "per-account-channel-peer"] = (
        "per-channel-peer"
    )
    identity_links: dict[str, list[str]] = {}
    reset: ResetPolicy = section()

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
    queue: QueueConfig = section()
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
    match: BindingMatch = section()


class CronSection(ConfigModel):
    enabled: bool = True
    catch_up: Duration = 3600.0
    timeout: Duration = 600.0
    agent_timeout: Duration = 3600.0


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


class MemorySection(ConfigModel):
    time_decay_lambda: float = Field(0.0, ge=0.0, description=(
        "Time decay per hour: score × exp(-λ·Δt_hours); 0 = no decay."))
    embeddings: EmbeddingsConfig | None = Field(None, description=(
        "Semantic search; None (default): BM25 + decay only, offline."))
    rrf_k: int = Field(60, ge=1, description="Reciprocal-rank-fusion constant k.")
    candidates: int = Field(50, ge=1, le=1000, description=(
        "How many results of each of BM25 and vector search are fused."))
    group_writes: bool = Field(False, description=(
        "Whether memory_write may write a group's shared scope (scope 'group')."))


class TimelineSection(ConfigModel):
    enabled: bool = True
    backend: Literal["sqlite"] = "sqlite"
    path: str | None = None


class MetricsSection(ConfigModel):
    """``GET /metrics``: needs the gateway token unless ``public_loopback`` (the server
    only listens on loopback, so this opens it to local scrapers only)."""

    enabled: bool = True
    public_loopback: bool = False


class ConfigSection(ConfigModel):
    """``config``: the last-known-good config (gateway/config/lkg.py)."""

    lkg_after: Duration = Field(60.0, description="a config that loaded and served this "
                                "long (seconds or 30s/5m) is kept as "
                                "<state_dir>/config.lkg.yaml; 0 = never keep one")
    on_invalid: Literal["refuse", "lkg"] = Field(
        "refuse", description="a start whose config fails validation: refuse (exit 2) or "
        "lkg (start on the last-known-good config, with a problem in status)")
