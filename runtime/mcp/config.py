"""``mcp.servers`` and ``tools.mcp`` config (issue 12 "MCP client")."""


import re
from typing import Self

from pydantic import Field, field_validator, model_validator

from runtime.config_types import ConfigModel, Duration


class McpServerConfig(ConfigModel):
    """One server: ``command`` (+ ``args``, ``env``, ``cwd``) for stdio, or ``url`` (+
    ``headers``) for streamable HTTP. ``start``: ``gateway`` (connect at start) or
    ``lazy`` (on first use)."""

    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = {}
    start: str = "gateway"
    enabled: bool = True

    @field_validator("start")
    @classmethod
    def _start(cls, v: str) -> str:
        if v not in ("gateway", "lazy"):
            raise ValueError("expected gateway or lazy")
        return v

    @model_validator(mode="after")
    def _one_transport(self) -> Self:
        if bool(self.command) == bool(self.url):
            raise ValueError("give either command (stdio) or url (streamable HTTP)")
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"


class McpSection(ConfigModel):
    servers: dict[str, McpServerConfig] = {}

    @field_validator("servers")
    @classmethod
    def _names(cls, v: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", name):
                raise ValueError(f"server name {name!r}: 1-32 letters, digits, '_' or '-'")
        return v


class McpToolSettings(ConfigModel):
    timeout: Duration = 30.0  # per tool call (seed 002 mcp_timeout_secs)
    connect_timeout: Duration = 30.0
    max_result_chars: int = Field(50_000, ge=100)
    backoff_initial: Duration = 1.0
    backoff_max: Duration = 60.0
