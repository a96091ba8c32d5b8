"""``mcp.servers`` and ``tools.mcp`` config (issue 12 "MCP client")."""


import re
from typing import Self

from pydantic import Field, field_validator, model_validator

from runtime.config_types import ConfigModel, Duration


class McpServerConfig(ConfigModel):
    """One server: ``command`` (+ ``args``, ``env``, ``cwd``) for stdio, or ``url`` (+
    ``headers``) for streamable HTTP. ``start``: ``gateway`` (connect at start) or
    ``lazy`` (on first use)."""

    command: str | None = Field(
        None,
        description="stdio: the program to run (the gateway starts it and stops it at shutdown).")
    args: list[str] = Field(
        [],
        description="stdio: its arguments.")
    env: dict[str, str] = Field(
        {},
        description=("added to a minimal environment (PATH, HOME, ...); the gateway's secrets are "
                     "not passed on."))
    cwd: str | None = Field(
        None,
        description="stdio: its working directory; null = the gateway's.")
    url: str | None = Field(
        None,
        description="Streamable HTTP: the server's URL.")
    headers: dict[str, str] = Field(
        {},
        description="Streamable HTTP: extra request headers (e.g. Authorization).")
    start: str = Field(
        "gateway",
        description=("gateway (connect at start) | lazy (connect on first call, tools from the "
                     "last connection)"))
    enabled: bool = Field(
        True,
        description="Connect this server.")

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
    servers: dict[str, McpServerConfig] = Field(
        {},
        description=("name -> server; its tools appear as mcp__<name>__<tool>, policy group "
                     "plugin:mcp:<name>."))

    @field_validator("servers")
    @classmethod
    def _names(cls, v: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", name):
                raise ValueError(f"server name {name!r}: 1-32 letters, digits, '_' or '-'")
        return v


class McpToolSettings(ConfigModel):
    timeout: Duration = Field(
        30.0,
        description="timeout of one MCP tool call.")  # per tool call (seed 002 mcp_timeout_secs)
    connect_timeout: Duration = Field(
        30.0,
        description="connect + initialize + tools/list; the gateway start waits at most this long.")
    max_result_chars: int = Field(50_000, ge=100,
        description="tool results are cut here.")
    backoff_initial: Duration = Field(
        1.0,
        description="reconnect delay after a server died (doubles per attempt)")
    backoff_max: Duration = Field(
        60.0,
        description="Longest reconnect delay.")
