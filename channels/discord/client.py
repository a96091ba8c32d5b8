"""discord.py client construction for the Discord adapter: intents, endpoints, guarded
gateway parsers, fatal close codes.

Facts from TESTING.md and the gateway docs
(https://discord.com/developers/docs/topics/opcodes-and-status-codes#gateway-close-event-codes):
discord.py takes its endpoints as process-wide class attributes; an exception in a gateway
parser ends ``Client.connect()``; close 4014 means a privileged intent (message content)
was requested without being enabled in the Developer Portal.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import discord
import yarl

from channels.discord.config import DiscordAccount

LIBRARY_GATEWAY = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
INTENT_HELP = (
    "Discord refused the gateway connection (close 4014, disallowed intents): enable "
    "'Message Content Intent' for this bot in the Developer Portal (Bot > Privileged "
    "Gateway Intents), or set message_content_intent: false for this account")
LOGIN_REJECTED = ("Discord rejected the bot token (HTTP 401 on login): check "
                  "channels.discord.token")
# Close codes after which retrying cannot help (the library does not reconnect either).
FATAL_CLOSE_CODES = {
    4004: "Discord rejected the bot token (gateway close 4004): check channels.discord.token",
    4010: "Discord rejected the shard (gateway close 4010)",
    4011: "Discord requires sharding for this bot (gateway close 4011)",
    4012: "Discord rejected the gateway API version (close 4012)",
    4013: "Discord rejected the requested intents as invalid (close 4013)",
    4014: INTENT_HELP,
}
# Without READY/RESUMED nothing works: let them fail loudly (the supervisor restarts).
_UNGUARDED = frozenset({"READY", "RESUMED"})


class Bounded(OrderedDict):
    """An insertion-ordered dict that forgets its oldest keys beyond ``cap``."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.cap:
            self.popitem(last=False)


def build_intents(message_content: bool) -> discord.Intents:
    """Gateway intents: guilds, guild + DM messages, reactions (guild + DM), and the
    privileged message content intent when ``message_content``."""
    intents = discord.Intents.none()
    intents.guilds = True
    intents.guild_messages = True
    intents.dm_messages = True
    intents.guild_reactions = True
    intents.dm_reactions = True
    intents.message_content = message_content
    return intents


def configure_endpoints(config: DiscordAccount) -> None:
    """Point discord.py (process-wide) at ``api_base_url`` and ``gateway_url`` (the
    library's default gateway when unset)."""
    discord.http.Route.BASE = config.api_base_url.rstrip("/")
    gateway = config.gateway_url
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = (
        yarl.URL(gateway) if gateway else LIBRARY_GATEWAY)


def new_client(config: DiscordAccount, *, guild_ready_timeout: float) -> discord.Client:
    """A plain ``discord.Client`` (not sharded) for ``config``. 429 waits above 30 s raise
    ``discord.RateLimited`` instead of sleeping inside the library (send_chunks waits them
    on the clock); replies never ping @everyone or roles."""
    # The adapter never joins voice: skip discord.py's "PyNaCl/davey not installed" warnings.
    discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False
    return discord.Client(
        intents=build_intents(config.message_content_intent),
        guild_ready_timeout=guild_ready_timeout,
        max_ratelimit_timeout=30.0,  # the smallest value discord.py accepts
        allowed_mentions=discord.AllowedMentions(everyone=False, roles=False, users=True,
                                                 replied_user=True),
        chunk_guilds_at_startup=False, max_messages=500)


def guard_parsers(client: discord.Client, on_error: Callable[[str, Exception], None],
                  on_message_raw: Callable[[dict[str, Any]], None]) -> None:
    """Wrap the client's gateway parsers (all but READY/RESUMED) so an exception is reported
    to ``on_error(event_name, exc)`` and the event skipped instead of ending ``connect()``.
    ``on_message_raw(data)`` sees each MESSAGE_CREATE payload before it is parsed."""
    parsers = client._connection.parsers  # the dict the websocket reads (same object)

    def guarded(event: str, parse: Callable[[Any], None]) -> Callable[[Any], None]:
        def run(data: Any) -> None:
            try:
                if event == "MESSAGE_CREATE":
                    on_message_raw(data)
                parse(data)
            except Exception as exc:  # noqa: BLE001 - one bad event must not end the gateway
                on_error(event, exc)
        return run

    for event, parse in list(parsers.items()):
        if event not in _UNGUARDED:
            parsers[event] = guarded(event, parse)
