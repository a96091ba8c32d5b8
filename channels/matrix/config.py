"""Config model of ``channels.matrix`` (one Matrix account; several under ``accounts``),
registered with the channel's plugin (channels/matrix/plugin.py).

A Matrix account logs in with an ``access_token`` (with ``user_id``) or a ``password``
(``user_id`` + ``password``: ``POST /login`` at every start, reusing ``device_id``).
The access policy (``dm_policy``, ``allow_from``, ``group_policy``, ``groups``,
``require_mention``) is the shared one of channels/config.py ``AccessConfig``: ``groups``
lists room ids (``!abc:example.org``), ``allow_from`` user ids (``@alice:example.org``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from channels.config import AccessConfig, LiveChatConfig, PlatformSection
from runtime.config_types import Duration


class MatrixAccount(AccessConfig, LiveChatConfig):
    """One Matrix bot account (a normal Matrix user the gateway logs in as)."""

    enabled: bool = Field(
        True,
        description="Connect this account.")
    homeserver: str | None = Field(
        None,
        description="The homeserver's client-server API base URL (https://matrix.example.org).")
    user_id: str | None = Field(
        None,
        description="The bot's full Matrix user id (@tidegate:example.org).")
    access_token: str | None = Field(
        None,
        description=("An access token of the bot user (keep it in the environment: "
                     "${MATRIX_ACCESS_TOKEN}); or set password instead."))
    password: str | None = Field(
        None,
        description=("The bot user's password, used to log in at every start when no "
                     "access_token is set (${MATRIX_PASSWORD})."))
    device_id: str = Field(
        "TIDEGATE",
        description="The device the password login reuses (one device, not one per start).")
    sync_timeout: Duration = Field(
        30.0,
        description="Long-poll wait of each /sync call.")
    timeline_limit: int = Field(
        50, ge=1,
        description=("events per room per /sync; a room with more since the last sync is read "
                     "back page by page (no gap)"))
    reconnect_max: Duration = Field(
        30.0,
        description=("Longest wait between two reconnect attempts after the homeserver "
                     "became unreachable (the wait doubles from 1s up to this)."))
    send_timeout: Duration = Field(
        30.0,
        description="Timeout of each send, upload and download request.")
    unhealthy_after: Duration = Field(
        120.0,
        description=("Cannot receive this long: one ERROR with the likely cause, "
                     "status.problems, /readyz 503."))


def _matrix_problems(acc: Any) -> list[str]:
    out = [] if acc.homeserver else ["homeserver: required when matrix is enabled"]
    if not acc.user_id:
        out.append("user_id: required when matrix is enabled")
    elif not (acc.user_id.startswith("@") and ":" in acc.user_id):
        out.append(f"user_id: must look like @name:server, got {acc.user_id!r}")
    if not acc.access_token and not acc.password:
        out.append("access_token: required (or password) when matrix is enabled")
    return out


class MatrixChannelConfig(PlatformSection, MatrixAccount):
    enabled: bool = Field(False, description="connect this platform (its accounts, or the one account of the section itself).")
    accounts: dict[str, MatrixAccount] = Field(
        {},
        description=("Several bot users: {<account_id>: {user_id: ..., any key above}}; each "
                     "inherits the keys it does not set."))
    _problems = staticmethod(_matrix_problems)
