"""Config models of the tool policy (seed 001 §4): the top-level ``tools`` section, the
``agents.*.tools`` section and the allow/deny rules used at group/channel level.

Entries of ``allow``/``deny`` are tool names, ``*`` globs, groups (``group:fs``, ...,
``plugin:<name>``, ``plugin:mcp:*``) and, inside ``allow`` only, ``!name`` negations.
``allow: null`` (the default) means "no restriction at this layer".
"""


from typing import Literal

from pydantic import Field, field_validator

from runtime.config_types import ConfigModel, Duration, section
from runtime.mcp.config import McpToolSettings
from runtime.tools.web.config import WebSettings

Profile = Literal["minimal", "coding", "messaging", "full"]


class ToolRules(ConfigModel):
    """One layer's ``allow`` (None = everything passes) and ``deny`` lists."""

    allow: list[str] | None = Field(
        None,
        description=("null = no restriction here; else names, globs (memory_*), groups (group:fs "
                     "...), \"!name\" negations."))
    deny: list[str] = Field(
        [],
        description="removes what it matches.")


class ProviderToolRules(ToolRules):
    """``tools.by_provider.<provider>``: a profile (layer 2) and allow/deny (layer 4)."""

    profile: Profile | None = Field(
        None,
        description="Layer 2: a profile for this provider (or provider/model).")


class SessionsToolsConfig(ConfigModel):
    """``tools.sessions``: what the sessions tools may reach. ``visibility`` ``agent``
    (default: only sessions of the calling agent) or ``all``; ``send_max_depth``: how
    many ``sessions_send`` hops may nest (A -> B -> A ... stops there)."""

    visibility: Literal["agent", "all"] = Field(
        "agent",
        description="sessions tools reach: agent (own sessions only) | all.")
    send_max_depth: int = Field(2, ge=1, le=10,
        description="nested sessions_send hops before a send is refused.")


class TaintSettings(ConfigModel):
    """``tools.taint``: what a turn may do once content from outside the trust boundary
    reached it (a fetched page, search results, an MCP tool's answer, a message from a
    sender who is not an owner). docs/exec.md "Tainted turns"."""

    mode: Literal["ask", "deny", "off"] = Field(
        "ask", description="ask: after taint, side-effecting tools need an approval even "
        "if allowlisted; deny: they are refused; off: taint is not tracked.")
    owners: list[str] = Field(
        [], description="Canonical sender ids <channel>:<sender id> whose messages do not "
        "taint a turn (agents.<id>.owners and the agent's tools.exec.approvers count as "
        "owners too: one list).")

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: object) -> object:
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false

    @field_validator("owners")
    @classmethod
    def _owners(cls, v: list[str]) -> list[str]:
        return sender_ids(v)


class ToolsSection(ConfigModel):
    """The top-level ``tools`` section: layers 1-4, sessions-tool reach, the web and MCP
    tool settings, and the tainted-turn rule."""

    profile: Profile = Field(
        "full",
        description="layer 1: minimal | coding | messaging | full.")
    allow: list[str] | None = Field(
        None,
        description="layer 3: e.g. [\"*\", \"!exec\", \"!process\"].")
    deny: list[str] = Field(
        [],
        description="Layer 3: tools, globs or groups removed for everyone.")
    by_provider: dict[str, ProviderToolRules] = Field(
        {},
        description=("layers 2 and 4: {<provider or provider/model>: {profile: null, allow: null, "
                     "deny: []}}."))
    sessions: SessionsToolsConfig = Field(
        section(),
        description="The sessions tools (sessions_list, sessions_history, sessions_send, ...).")
    web: WebSettings = Field(
        section(),
        description="The web_fetch and web_search tools.")
    mcp: McpToolSettings = Field(
        section(),
        description="Timeouts and limits of MCP servers' tools.")
    taint: TaintSettings = Field(
        section(),
        description=("tainted turns: after web_fetch/web_search/MCP results or a "
                     "non-owner's message."))


_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def sender_ids(ids: list[str]) -> list[str]:
    """Canonical sender ids ``<channel>:<sender id>`` (channel lower-cased). Raises
    ValueError naming a malformed one."""
    out = []
    for a in ids:
        channel, _, sender = a.partition(":")
        if not channel.strip() or not sender.strip():
            raise ValueError(f"{a!r}: expected <channel>:<sender id>")
        out.append(f"{channel.strip().lower()}:{sender.strip()}")
    return out


class ExecRules(ConfigModel):
    """``agents.*.tools.exec``: what ``exec`` commands get and which need an approval
    (docs/exec.md)."""

    env: dict[str, str] = Field(
        {}, description="Extra environment variables for commands, on top of PATH, LANG, "
        "TZ and HOME (= the workspace). A configured secret is refused.")
    security: Literal["deny", "allowlist", "full"] = Field(
        "full", description="deny: exec never runs; allowlist: only commands matching "
        "'allowlist' (or an approved one); full: any command.")
    ask: Literal["off", "on-miss", "always"] = Field(
        "off", description="off: a miss is denied; on-miss: a miss asks the approvers; "
        "always: every command asks.")
    allowlist: list[str] = Field(
        [], description="Command patterns matched on the parsed argv: a word, or * for "
        "one or more further arguments at the end ('git log *').")
    approvers: list[str] = Field(
        [], description="Who may approve: canonical sender ids <channel>:<sender id>.")
    approval_timeout: Duration = Field(
        300.0, gt=0, description="Seconds to wait for an approval; no answer is a deny.")

    @field_validator("ask", mode="before")
    @classmethod
    def _yaml_off(cls, v: object) -> object:
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        import re
        bad = [k for k in v if not re.match(_ENV_NAME, k)]
        if bad:
            raise ValueError(f"not an environment variable name: {bad[0]!r}")
        return v

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, v: list[str]) -> list[str]:
        return sender_ids(v)


class AgentToolRules(ToolRules):
    """``agents.defaults.tools`` / ``agents.list[].tools``: layers 5 and 6, and the exec
    rules."""

    by_provider: dict[str, ToolRules] = {}
    exec: ExecRules = Field(
        section(),
        description="what exec commands get and which need approval (see the exec page).")
