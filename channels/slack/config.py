"""Config model of ``channels.slack`` (and ``channels.slack.accounts.<id>``).

Registered with the channel's plugin (``channels/slack/plugin.py``); the shared access,
streaming and account-inheritance pieces come from ``channels/config.py``.
"""

from typing import Any, Literal

from pydantic import Field

from channels.config import AccessConfig, LiveChatConfig, PlatformSection
from runtime.config_types import Duration


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


def _slack_problems(acc: Any) -> list[str]:
    out = [] if acc.bot_token else ["bot_token: required when slack is enabled"]
    if acc.mode == "socket" and not acc.app_token:
        out.append("app_token: required for mode socket")
    if acc.mode == "http" and not acc.signing_secret:
        out.append("signing_secret: required for mode http")
    return out


class SlackChannelConfig(PlatformSection, SlackAccount):
    enabled: bool = Field(False, description="connect this platform (its accounts, or the one account of the section itself).")
    accounts: dict[str, SlackAccount] = Field(
        {},
        description=("Several workspaces or apps: {<account_id>: {bot_token: ..., any key above}};"
                     " each inherits the keys it does not set."))
    _problems = staticmethod(_slack_problems)
