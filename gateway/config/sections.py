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
