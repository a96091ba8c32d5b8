"""Discord application commands (issue 13 "Commands, natively registered"): the chat
commands of channels/inbound/commands.py as slash commands, through discord.py's ``app_commands``.

- Registration: one ``CommandTree`` per client; ``sync_commands`` overwrites the commands
  of every guild in ``guild_ids`` (``PUT /applications/{app}/guilds/{guild}/commands``,
  instant) or, without ``guild_ids``, the global set (``PUT /applications/{app}/commands``,
  which Discord propagates within about an hour). A failure (the bot was invited without
  the ``applications.commands`` scope: 403 50001) is logged, never fatal.
- Options: a command whose usage lists fixed values (``/think off|low|medium|high``) gets
  one optional ``value`` option with those choices; one with a free argument
  (``/model [ref|list|default]``) a free-text ``value``; group-only commands
  (``/activation``) are guild-only.
- An invocation (INTERACTION_CREATE) is deferred at once, ephemeral "thinking…" (Discord
  wants an answer within 3 s), then handed to the gateway as the text ``/name value``; the
  gateway's notice edits the deferred response (``PATCH
  /webhooks/{app}/{token}/messages/@original``), longer answers continue as ephemeral
  follow-ups (``POST /webhooks/{app}/{token}``). See channels/inbound/command_replies.py.

Sources: https://discord.com/developers/docs/interactions/application-commands and
.../interactions/receiving-and-responding (3 s initial response, tokens valid 15 min,
flag 64 EPHEMERAL).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import discord
import structlog
from discord import app_commands

from channels.base import DeliveryResult, InboundMessage
from channels.discord.inbound import CHANNEL, Conversation
from channels.discord.rest import shielded
from channels.inbound.command_replies import Reply
from channels.inbound.commands import CATALOGUE, ChatCommand
from channels.outbound.render import render_chunks
from runtime.clock import Clock, maybe_timeout

log = structlog.get_logger(__name__)

TOKEN_TTL = 14 * 60.0  # s; an interaction token is valid for 15 minutes
Handler = Callable[[discord.Interaction, str, str], Awaitable[None]]


def fixed_choices(usage: str) -> list[str]:
    """``"off|low|medium|high"`` -> the four values; [] for optional or free arguments
    (``"[ref|list|default]"``, ``"[kill ID]"``)."""
    if not usage or "[" in usage or "|" not in usage:
        return []
    return [v.strip() for v in usage.split("|") if v.strip()]


def _command(spec: ChatCommand, handler: Handler) -> app_commands.Command:
    name = spec.name
    if not spec.usage:
        async def run_bare(interaction: discord.Interaction) -> None:
            await handler(interaction, name, "")
        callback: Any = run_bare
    else:
        async def run(interaction: discord.Interaction, value: str | None = None) -> None:
            await handler(interaction, name, value or "")
        callback = app_commands.describe(value=spec.usage[:100])(run)
        choices = fixed_choices(spec.usage)
        if choices:
            callback = app_commands.choices(
                value=[app_commands.Choice(name=c, value=c) for c in choices])(callback)
    if spec.scope == "group":
        callback = app_commands.guild_only()(callback)
    return app_commands.Command(name=name, description=spec.description[:100],
                                callback=callback)


def build_tree(client: discord.Client, handler: Handler,
               commands: Iterable[ChatCommand] = CATALOGUE) -> app_commands.CommandTree:
    """A command tree on ``client`` whose every command calls ``handler(interaction,
    name, value)``. discord.py allows one tree per client."""
    tree = app_commands.CommandTree(client)
    for spec in commands:
        tree.add_command(_command(spec, handler))

    async def on_error(interaction: discord.Interaction,
                       error: app_commands.AppCommandError) -> None:
        log.warning("discord_command_failed", interaction_id=str(interaction.id),
                    command=getattr(interaction.command, "name", None),
                    error=f"{type(error).__name__}: {error}")
    tree.on_error = on_error
    return tree


async def sync_commands(tree: app_commands.CommandTree, guild_ids: list[str], *,
                        account_id: str) -> int:
    """Register the tree's commands: per guild in ``guild_ids`` (copied from the global
    set), else globally. Returns how many scopes were synced; never raises."""
    scopes: list[discord.Object | None] = [discord.Object(id=int(g)) for g in guild_ids] \
        or [None]
    synced = 0
    for guild in scopes:
        try:
            if guild is not None:
                tree.copy_global_to(guild=guild)
            commands = await shielded(tree.sync(guild=guild))
        except (discord.HTTPException, discord.ClientException, ValueError) as exc:
            log.error("discord_commands_sync_failed", account_id=account_id,
                      guild_id=str(guild.id) if guild else None,
                      error=f"{type(exc).__name__}: {exc}",
                      hint="invite the bot with the applications.commands scope")
            continue
        synced += 1
        log.info("discord_commands_synced", account_id=account_id,
                 guild_id=str(guild.id) if guild else None, scope="guild" if guild else
                 "global", commands=len(commands))
    return synced


def interaction_to_inbound(interaction: discord.Interaction, conv: Conversation, text: str,
                           *, account_id: str, received_at: float) -> InboundMessage:
    """An application-command invocation as the typed command ``text`` (addressed to the
    bot, so no mention is needed in groups). ``message_id`` is ``interaction:<id>`` (the
    dedupe key: Discord never sends one interaction twice, a resumed gateway might)."""
    user = interaction.user
    return InboundMessage(
        channel=CHANNEL, account_id=account_id, text=text, chat_type=conv.chat_type,
        sender_id=str(user.id), peer_id=str(user.id), group_id=conv.group_id,
        thread_id=conv.thread_id, sender_name=user.display_name, sender_username=user.name,
        mentions_bot=True, message_id=f"interaction:{interaction.id}",
        received_at=received_at, is_bot=bool(user.bot))


def interaction_reply(interaction: discord.Interaction, *, clock: Clock,
                      timeout: float) -> tuple[Reply, Callable[[], Awaitable[None]]]:
    """``(reply, expire)`` for a deferred ephemeral invocation: ``reply(text)`` edits the
    deferred response with the first part and sends the rest as ephemeral follow-ups;
    ``expire()`` deletes the placeholder."""
    async def reply(text: str) -> DeliveryResult:
        parts = [c.formatted for c in render_chunks(text, "discord")] or ["(empty)"]
        sent: list[str] = []
        try:
            async with maybe_timeout(clock, timeout):
                first = await shielded(interaction.edit_original_response(content=parts[0]))
                sent.append(str(first.id))
                for part in parts[1:]:
                    more = await shielded(interaction.followup.send(part, ephemeral=True,
                                                                    wait=True))
                    sent.append(str(more.id))
        except (discord.HTTPException, TimeoutError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if not sent:  # nothing shown: the adapter posts it to the conversation instead
                return DeliveryResult(ok=False, error=error, retryable=True)
            log.warning("discord_command_followup_failed", interaction_id=str(interaction.id),
                        parts_sent=len(sent), parts=len(parts), error=error)
        return DeliveryResult(ok=True, message_ids=sent)

    async def expire() -> None:
        async with maybe_timeout(clock, timeout):
            await shielded(interaction.delete_original_response())
    return reply, expire
