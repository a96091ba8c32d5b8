"""Config models of the channel sections (``channels.*`` in config.yaml).

Per-account settings nest under ``accounts.<id>`` with the same names; an account inherits
every top-level key it does not set (see ``account_configs``). Interface names are fixed by
issue 3 (``token``, ``api_base_url``, ``dm_policy``, ``allow_from``, ``groups``, ...).
"""


import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from runtime.config_types import ConfigModel, Duration, Lazy, section
from runtime.tools.config import ToolRules


def _id_str(value: Any) -> Any:
    # YAML reads an unquoted Discord/Telegram id as an int; ids are strings everywhere.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


IdStr = Annotated[str, BeforeValidator(_id_str)]
DmPolicy = Literal["pairing", "allowlist", "open", "disabled"]
GroupPolicy = Literal["allowlist", "open", "disabled"]


class GroupSettings(ConfigModel):
    """``groups.<group_id>`` when ``groups`` is a mapping: the group is allowlisted and
    its ``tools`` narrow the tool set in it (tool policy layer 7); ``require_mention``
    overrides the account's rule there (``/activation`` overrides both at runtime);
    ``system_prompt`` is added to the prompt of turns in that group (quoted as operator
    text under "# Chat"); ``dm_scope`` (one of ``session.dm_scope``'s values) puts each
    sender's messages in that group into the sender's DM session under that scope instead
    of the group's shared session (``main``: the agent's main session), replies still
    going to the group."""

    tools: ToolRules = section()
    require_mention: bool | None = None
    system_prompt: str | None = None
    dm_scope: Literal["main", "per-peer", "per-channel-peer",
                      "per-account-channel-peer"] | None = None


class DmSettings(ConfigModel):
    """``dm``: settings of direct messages; ``tools`` is tool policy layer 7 for DMs."""

    tools: ToolRules = section()


class AccessConfig(ConfigModel):
    """Access policy shared by all platforms (enforced before any model call).

    ``groups`` is a list of allowlisted group ids, or a mapping group id -> settings
    (the keys are the allowlist)."""

    dm_policy: DmPolicy = "pairing"
    allow_from: list[IdStr] = []
    group_policy: GroupPolicy = "allowlist"
    groups: list[IdStr] | dict[IdStr, GroupSettings] = []
    dm: DmSettings = section()
    require_mention: bool = True
    allow_bots: bool = False
    debounce: Duration = 0.0  # idle-session burst merging (seconds; 0 = start at once)


StreamMode = Literal["off", "partial", "block"]
ReplyToMode = Literal["off", "first", "all"]


def _streaming_shorthand(value: Any) -> Any:
    # ``streaming: partial`` is short for ``streaming: {mode: partial}``; false means off.
    if isinstance(value, str):
        return {"mode": value}
    if value is False:
        return {"mode": "off"}
    return value


class StreamingConfig(ConfigModel):
    """``channels.<p>.streaming``: ``mode`` off|partial|block (None: partial in DMs, block
    in groups); ``min_interval`` seconds between edits of one streamed reply (None: the
    platform's default, channels/outbound/streaming.py ``DEFAULT_MIN_INTERVAL``)."""

    mode: StreamMode | None = None
    min_interval: Duration | None = None


class LiveChatConfig(ConfigModel):
    """Issue 13 settings shared by the chat platforms: streamed replies, quoting of the
    triggering message (``reply_to_mode``) and the group context kept for the next
    mentioned turn (``group_history``, channels/inbound/group_history.py)."""

    streaming: Annotated[StreamingConfig, BeforeValidator(_streaming_shorthand)] = section()
    reply_to_mode: ReplyToMode = "first"
    group_history: int = Field(30, ge=0)  # unmentioned group messages kept as context
    tool_progress: bool = False  # default of /verbose: a "🔧 read notes.md" status line


class TelegramAccount(AccessConfig, LiveChatConfig):
    enabled: bool = True
    token: str | None = None
    api_base_url: str = "https://api.telegram.org/bot"
    api_file_url: str | None = None
    mode: Literal["polling", "webhook"] = "polling"
    webhook_secret: str | None = None
    webhook_path: str = "/telegram/webhook"
    webhook_url: str | None = None
    poll_timeout: Duration = 30.0
    send_timeout: Duration = 30.0
    unhealthy_after: Duration = 120.0  # cannot receive this long: ERROR, problem, /readyz 503


class SlackAccount(AccessConfig, LiveChatConfig):
    enabled: bool = True
    bot_token: str | None = None
    app_token: str | None = None
    signing_secret: str | None = None
    mode: Literal["socket", "http"] = "socket"
    api_base_url: str = "https://slack.com/api/"
    events_path: str = "/slack/events"
    send_timeout: Duration = 30.0
    unhealthy_after: Duration = 120.0
    thread_history: int = Field(20, ge=0)  # a thread session's first turn: earlier messages
    thread_history_chars: int = Field(8000, ge=0)  # ... and at most this much of their text
    reply_in_thread: bool = True  # a top-level channel mention is answered in its thread
    native_streaming: bool = True  # partial replies in threads: chat.startStream/appendStream


class DiscordAccount(AccessConfig, LiveChatConfig):
    enabled: bool = True
    token: str | None = None
    api_base_url: str = "https://discord.com/api/v10"
    gateway_url: str | None = None
    message_content_intent: bool = True
    send_timeout: Duration = 30.0
    unhealthy_after: Duration = 120.0
    native_commands: bool = True  # register the chat commands as application commands
    guild_ids: list[IdStr] = []  # sync there (instant), else global
    reply_in_thread: bool = False  # a top-level guild mention is answered in a new thread


def _accounts_with_inheritance(section: dict[str, Any]) -> dict[str, Any]:
    if "accounts" not in section:
        return section  # nothing to inherit; ``accounts`` stays unset (model_fields_set)
    base = {k: v for k, v in section.items() if k != "accounts"}
    accounts = section["accounts"] or {}
    if not isinstance(accounts, dict):
        return section
    merged = {aid: {**base, **(acc or {})} if isinstance(acc, dict) else acc
              for aid, acc in accounts.items()}
    return {**section, "accounts": merged}


def _telegram_problems(acc: Any) -> list[str]:
    out = [] if acc.token else ["token: required when telegram is enabled"]
    if acc.mode == "webhook" and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}",
                                                  acc.webhook_secret or ""):
        out.append("webhook_secret: required for mode webhook: 1-256 characters of "
                   "A-Z a-z 0-9 _ - (Telegram's rule)")
    return out


def _slack_problems(acc: Any) -> list[str]:
    out = [] if acc.bot_token else ["bot_token: required when slack is enabled"]
    if acc.mode == "socket" and not acc.app_token:
        out.append("app_token: required for mode socket")
    if acc.mode == "http" and not acc.signing_secret:
        out.append("signing_secret: required for mode http")
    return out


def _discord_problems(acc: Any) -> list[str]:
    return [] if acc.token else ["token: required when discord is enabled"]


class _PlatformSection:
    """Shared behaviour of the platform sections: accounts inherit the section's keys,
    and every enabled account is checked (``_problems``) when the platform is enabled."""

    _problems: Any = None

    @model_validator(mode="before")
    @classmethod
    def _inherit(cls, data: Any) -> Any:
        return _accounts_with_inheritance(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _required(self) -> Any:
        if not self.enabled:
            return self
        items = self.accounts.items() if self.accounts else [("", self)]
        problems = [f"accounts.{aid}.{p}" if aid else p
                    for aid, acc in items if acc.enabled for p in type(self)._problems(acc)]
        if problems:
            raise ValueError("\n".join(problems))
        return self


class TelegramChannelConfig(_PlatformSection, TelegramAccount):
    enabled: bool = False
    accounts: dict[str, TelegramAccount] = {}
    _problems = staticmethod(_telegram_problems)


class SlackChannelConfig(_PlatformSection, SlackAccount):
    enabled: bool = False
    accounts: dict[str, SlackAccount] = {}
    _problems = staticmethod(_slack_problems)


class DiscordChannelConfig(_PlatformSection, DiscordAccount):
    enabled: bool = False
    accounts: dict[str, DiscordAccount] = {}
    _problems = staticmethod(_discord_problems)


class WebchatConfig(ConfigModel):
    enabled: bool = True
    dm_policy: DmPolicy = "open"
    debounce: Duration = 0.0


class OpenAIApiConfig(ConfigModel):
    """The OpenAI-compatible ``/v1/chat/completions`` endpoint on the gateway."""

    enabled: bool = True
    debounce: Duration = 0.0


class ChannelsConfig(ConfigModel):
    webchat: Lazy[WebchatConfig] = section()
    openai_api: Lazy[OpenAIApiConfig] = section()
    telegram: Lazy[TelegramChannelConfig] = section()
    slack: Lazy[SlackChannelConfig] = section()
    discord: Lazy[DiscordChannelConfig] = section()


def account_configs(section: TelegramChannelConfig | SlackChannelConfig | DiscordChannelConfig
                    ) -> dict[str, Any]:
    """The enabled accounts of a platform section: ``{account_id: account_config}``.

    Without ``accounts`` the section itself is the single account ``default``.
    """
    if not section.enabled:
        return {}
    if not section.accounts:
        return {"default": section}
    return {aid: acc for aid, acc in section.accounts.items() if acc.enabled}


_SECTION_OF_CHANNEL = {"openai": "openai_api"}


def channel_debounce(channels: ChannelsConfig, channel: str, account: str = "default") -> float:
    """``channels.<channel>[.accounts.<account>].debounce`` in seconds (0 for channels
    without a section, e.g. the CLI): how long a message to an IDLE session waits for more
    messages of a burst before its turn starts. Busy sessions follow ``messages.queue``."""
    section = getattr(channels, _SECTION_OF_CHANNEL.get(channel, channel), None)
    if section is None:
        return 0.0
    accounts = getattr(section, "accounts", None)
    if accounts and account in accounts:
        section = accounts[account]
    return float(getattr(section, "debounce", 0.0) or 0.0)
