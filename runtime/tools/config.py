"""Config models of the tool policy (seed 001 §4): the top-level ``tools`` section, the
``agents.*.tools`` section and the allow/deny rules used at group/channel level.

Entries of ``allow``/``deny`` are tool names, ``*`` globs, groups (``group:fs``, ...,
``plugin:<name>``, ``plugin:mcp:*``) and, inside ``allow`` only, ``!name`` negations.
``allow: null`` (the default) means "no restriction at this layer".
"""


from typing import Literal

from pydantic import Field

from runtime.config_types import ConfigModel, section
from runtime.mcp.config import McpToolSettings
from runtime.tools.web.config import WebSettings

Profile = Literal["minimal", "coding", "messaging", "full"]


class ToolRules(ConfigModel):
    """One layer's ``allow`` (None = everything passes) and ``deny`` lists."""

    allow: list[str] | None = None
    deny: list[str] = []


class ProviderToolRules(ToolRules):
    """``tools.by_provider.<provider>``: a profile (layer 2) and allow/deny (layer 4)."""

    profile: Profile | None = None


class SessionsToolsConfig(ConfigModel):
    """``tools.sessions``: what the sessions tools may reach. ``visibility`` ``agent``
    (default: only sessions of the calling agent) or ``all``; ``send_max_depth``: how
    many ``sessions_send`` hops may nest (A -> B -> A ... stops there)."""

    visibility: Literal["agent", "all"] = "agent"
    send_max_depth: int = Field(2, ge=1, le=10)


class ToolsSection(ConfigModel):
    """The top-level ``tools`` section: layers 1-4, sessions-tool reach, and the web and
    MCP tool settings."""

    profile: Profile = "full"
    allow: list[str] | None = None
    deny: list[str] = []
    by_provider: dict[str, ProviderToolRules] = {}
    sessions: SessionsToolsConfig = section()
    web: WebSettings = section()
    mcp: McpToolSettings = section()


class AgentToolRules(ToolRules):
    """``agents.defaults.tools`` / ``agents.list[].tools``: layers 5 and 6."""

    by_provider: dict[str, ToolRules] = {}
