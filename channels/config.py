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

    tools: ToolRules = Field(
        section(),
        description="Tool policy layer 7 for this group.")
    require_mention: bool | None = Field(
        None,
        description=("Override of the account's require_mention in this group; null = the "
                     "account's."))
    system_prompt: str | None = Field(
        None,
        description="Operator instructions added to the prompt of this group's turns.")
    dm_scope: Literal["main", "per-peer", "per-channel-peer",
                      "per-account-channel-peer"] | None = Field(
        None,
        description=("null = one shared group session; else each sender's messages join that "
                     "sender's DM session under this scope (replies still go to the group)."))


class DmSettings(ConfigModel):
    """``dm``: settings of direct messages; ``tools`` is tool policy layer 7 for DMs."""

    tools: ToolRules = Field(
        section(),
        description="tool policy layer 7 for direct messages.")


class AccessConfig(ConfigModel):
    """Access policy shared by all platforms (enforced before any model call).

    ``groups`` is a list of allowlisted group ids, or a mapping group id -> settings
    (the keys are the allowlist)."""

    dm_policy: DmPolicy = Field(
        "pairing",
        description="pairing | allowlist | open | disabled.")
    allow_from: list[IdStr] = Field(
        [],
        description="user ids or usernames (\"*\" = everyone)")
    group_policy: GroupPolicy = Field(
        "allowlist",
        description="allowlist | open | disabled.")
    groups: list[IdStr] | dict[IdStr, GroupSettings] = Field(
        [],
        description=("allowed group/chat ids (\"*\" = all); or a mapping with per-group tool policy "
                     "(layer 7)."))
    dm: DmSettings = Field(
        section(),
        description="Settings of direct messages.")
    require_mention: bool = Field(
        True,
        description="in groups, answer only when mentioned or replied to.")
    allow_bots: bool = Field(
        False,
        description="Whether messages from other bots may start turns.")
    debounce: Duration = Field(
        0.0,
        description=("idle-session burst merging (see webchat.debounce); 0 = a message starts its "
                     "turn at once."))  # idle-session burst merging (seconds; 0 = start at once)


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

    mode: StreamMode | None = Field(
        None,
        description=("off | partial (one message grows) | block (one message per paragraph); null "
                     "= partial in DMs, block in groups."))
    min_interval: Duration | None = Field(
        None,
        description="Least time between two updates of one streamed reply; null = 1s.")


class LiveChatConfig(ConfigModel):
    """Issue 13 settings shared by the chat platforms: streamed replies, quoting of the
    triggering message (``reply_to_mode``) and the group context kept for the next
    mentioned turn (``group_history``, channels/inbound/group_history.py)."""

    streaming: Annotated[StreamingConfig, BeforeValidator(_streaming_shorthand)] = Field(
        section(),
        description=("off | partial | block (null: partial in DMs, block in groups); min_interval "
                     "null = 1s."))
    reply_to_mode: ReplyToMode = Field(
        "first",
        description=("quote the triggering message on: off (no part) | first (first part) | all "
                     "(every part)"))
    group_history: int = Field(30, ge=0,
        description=("unmentioned messages of an allowed group kept (in memory, <= 6000 chars) for"
                     " the next mentioned turn; 0 = off."))  # unmentioned group messages kept as context
    tool_progress: bool = Field(
        False,
        description=("default of /verbose: a \"🔧 read notes.md\" status line edited in place while "
                     "tools run."))  # default of /verbose: a "🔧 read notes.md" status line


class TelegramAccount(AccessConfig, LiveChatConfig):
    enabled: bool = Field(
        True,
        description="Connect this account.")
    token: str | None = Field(
        None,
        description=("The bot token from BotFather (keep it in the environment: "
                     "${TELEGRAM_BOT_TOKEN})."))
    api_base_url: str = Field(
        "https://api.telegram.org/bot",
        description="Bot API base URL; the token is appended (only for a proxy or tests).")
    api_file_url: str | None = Field(
        None,
        description="Base URL for file downloads; null = derived from api_base_url.")
    mode: Literal["polling", "webhook"] = Field(
        "polling",
        description="polling (long-poll getUpdates, no public URL) | webhook (Telegram calls webhook_url).")
    webhook_secret: str | None = Field(
        None,
        description="webhook: checked against X-Telegram-Bot-Api-Secret-Token.")
    webhook_path: str = Field(
        "/telegram/webhook",
        description="Webhook mode: the path mounted on the gateway's HTTP server.")
    webhook_url: str | None = Field(
        None,
        description="webhook: public URL registered with setWebhook.")
    poll_timeout: Duration = Field(
        30.0,
        description="Polling: long-poll wait of each getUpdates call.")
    send_timeout: Duration = Field(
        30.0,
        description="HTTP timeout of each send.")
    unhealthy_after: Duration = Field(
        120.0,
        description=("cannot receive this long: one ERROR with the likely cause, status.problems, "
                     "/readyz 503."))  # cannot receive this long: ERROR, problem, /readyz 503


class SlackAccount(AccessConfig, LiveChatConfig):
    enabled: bool = Field(
        True,
        description="Connect this account.")
    bot_token: str | None = Field(
        None,
        description="The bot token (xoxb-...), from OAuth & Permissions.")
    app_token: str | None = Field(
        None,
        description="Socket Mode: the app-level token (xapp-..., scope connections:write).")
    signing_secret: str | None = Field(
        None,
        description="HTTP mode: the app's signing secret (Basic Information → App Credentials); requests without a valid signature get 401.")
    mode: Literal["socket", "http"] = Field(
        "socket",
        description="socket (Socket Mode, no public URL) | http (the Events API posts to events_path).")
    api_base_url: str = Field(
        "https://slack.com/api/",
        description="Slack Web API base URL (only for a proxy or tests; keep the trailing slash).")
    events_path: str = Field(
        "/slack/events",
        description="HTTP mode: the Events API path mounted on the gateway's HTTP server.")
    send_timeout: Duration = Field(
        30.0,
        description="Timeout of each Web API call.")
    unhealthy_after: Duration = Field(
        120.0,
        description=("Cannot receive this long: one ERROR with the likely cause, status.problems, "
                     "/readyz 503."))
    thread_history: int = Field(20, ge=0,
        description=("a thread session's first turn sees up to this many earlier thread messages "
                     "(0 = off)"))  # a thread session's first turn: earlier messages
    thread_history_chars: int = Field(8000, ge=0,
        description="characters of text of that thread history at most (the root and the newest replies are kept).")  # ... and at most this much of their text
    reply_in_thread: bool = Field(
        True,
        description=("a top-level channel mention is answered in a thread of that message (the "
                     "thread is its session)"))  # a top-level channel mention is answered in its thread
    native_streaming: bool = Field(
        True,
        description=("partial streaming in threads uses chat.startStream/appendStream/stopStream "
                     "(false: postMessage + chat.update)"))  # partial replies in threads: chat.startStream/appendStream


class DiscordAccount(AccessConfig, LiveChatConfig):
    enabled: bool = Field(
        True,
        description="Connect this account.")
    token: str | None = Field(
        None,
        description=("The bot token from the Developer Portal (keep it in the environment: "
                     "${DISCORD_BOT_TOKEN})."))
    api_base_url: str = Field(
        "https://discord.com/api/v10",
        description="Discord REST base URL (only for a proxy or tests).")
    gateway_url: str | None = Field(
        None,
        description="Discord gateway WebSocket URL; null = Discord's (set only for a proxy or tests).")
    message_content_intent: bool = Field(
        True,
        description="request the message content intent; must match the switch in the Developer Portal (off: only DMs, mentions and replies carry text).")
    send_timeout: Duration = Field(
        30.0,
        description="Timeout of each message part.")
    unhealthy_after: Duration = Field(
        120.0,
        description=("Cannot receive this long: one ERROR with the likely cause, status.problems, "
                     "/readyz 503."))
    native_commands: bool = Field(
        True,
        description=("register the chat commands as slash commands (app_commands), answered "
                     "ephemerally."))  # register the chat commands as application commands
    guild_ids: list[IdStr] = Field(
        [],
        description=("register them in these servers (instant, not in DMs); [] = globally (servers"
                     " + DMs)"))  # sync there (instant), else global
    reply_in_thread: bool = Field(
        False,
        description=("true: a top-level channel mention is answered in a new thread started from "
                     "it (needs Create Public Threads)"))  # a top-level guild mention is answered in a new thread


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
    enabled: bool = Field(False, description="connect this platform (its accounts, or the one account of the section itself).")
    accounts: dict[str, TelegramAccount] = Field(
        {},
        description="several bots: {<account_id>: {token: ..., any key above}}.")
    _problems = staticmethod(_telegram_problems)


class SlackChannelConfig(_PlatformSection, SlackAccount):
    enabled: bool = Field(False, description="connect this platform (its accounts, or the one account of the section itself).")
    accounts: dict[str, SlackAccount] = Field(
        {},
        description=("Several workspaces or apps: {<account_id>: {bot_token: ..., any key above}};"
                     " each inherits the keys it does not set."))
    _problems = staticmethod(_slack_problems)


class DiscordChannelConfig(_PlatformSection, DiscordAccount):
    enabled: bool = Field(False, description="connect this platform (its accounts, or the one account of the section itself).")
    accounts: dict[str, DiscordAccount] = Field(
        {},
        description=("Several bots: {<account_id>: {token: ..., any key above}}; each inherits the"
                     " keys it does not set."))
    _problems = staticmethod(_discord_problems)


class WebchatConfig(ConfigModel):
    enabled: bool = Field(
        True,
        description="chat page at http://127.0.0.1:<port>/ (tidegate dashboard prints the URL)")
    dm_policy: DmPolicy = Field(
        "open",
        description="Who may chat through the page (it already needs the gateway token).")
    debounce: Duration = Field(
        0.0,
        description=("idle-session burst merging on this channel: messages within this long of "
                     "each other share one turn (0 = start at once)"))


class OpenAIApiConfig(ConfigModel):
    """The OpenAI-compatible ``/v1/chat/completions`` endpoint on the gateway."""

    enabled: bool = Field(
        True,
        description="POST /v1/chat/completions and GET /v1/models (bearer token)")
    debounce: Duration = Field(
        0.0,
        description=("Idle-session burst merging on this endpoint (0 = a request starts its turn "
                     "at once)."))


class ChannelsConfig(ConfigModel):
    webchat: Lazy[WebchatConfig] = Field(
        section(),
        description="The control UI's chat page and its WebSocket.")
    openai_api: Lazy[OpenAIApiConfig] = Field(
        section(),
        description="The OpenAI-compatible endpoint for any OpenAI client.")
    telegram: Lazy[TelegramChannelConfig] = Field(
        section(),
        description="The Telegram bot (one token; several under accounts).")
    slack: Lazy[SlackChannelConfig] = Field(
        section(),
        description="The Slack app (Socket Mode or the HTTP Events API; several under accounts).")
    discord: Lazy[DiscordChannelConfig] = Field(
        section(),
        description="The Discord bot (gateway connection; several under accounts).")


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
