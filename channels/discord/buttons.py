"""Message components on Discord (Discord API reference: "Message Components", "Button",
"Receiving and Responding"): a message with one action row of buttons, a press (an
INTERACTION_CREATE of type MESSAGE_COMPONENT) as a :class:`channels.base.ButtonPress`
answered with an ephemeral message (only the presser sees it), and the buttons removed
once decided (an edit with ``components: []``).

The message goes out through discord.py's own HTTP client (``client.http.request`` with a
``discord.http.Route``): no ``discord.ui.View`` is registered, so every press reaches the
gateway (``on_interaction``), after a restart too.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import discord

from channels.base import Button, ButtonPress
from channels.discord.send import resolve_target
from runtime.clock import Clock

_STYLES = {"primary": 1, "danger": 4}


def literal(text: str) -> str:
    """``text`` as a Discord code block, so Markdown in it (``||spoilers||`` that hide
    characters, ``*``, ``~~``, links) shows as typed. A backtick, which could close the
    block, is shown as U+02CB (a look-alike): a real U+02CB in ``text`` looks the same,
    which only ever makes a command look more dangerous. At most 2,000 characters."""
    body = text.replace("`", "\u02cb")
    return f"```\n{body[:2000 - 8]}\n```"


def components_for(buttons: list[Button]) -> list[dict[str, Any]]:
    return [{"type": 1, "components": [
        {"type": 2, "style": _STYLES.get(b.style or "", 2), "label": b.label[:80],
         "custom_id": b.action[:100]} for b in buttons]}]


async def send_buttons(client: discord.Client, to: str, text: str, buttons: list[Button],
                       dm_channels: MutableMapping[str, int], *, clock: Clock,
                       timeout: float | None) -> str:
    """Post ``text`` (shown literally: :func:`literal`) with buttons into ``to`` (a
    channel, or a user id: their DM); returns
    ``<channel id>:<message id>``. Raises RuntimeError when Discord refuses."""
    try:
        channel = await resolve_target(client, to, None, dm_channels, clock=clock,
                                       timeout=timeout)
        msg = await client.http.request(
            discord.http.Route("POST", "/channels/{channel_id}/messages",
                               channel_id=channel),
            json={"content": literal(text), "components": components_for(buttons),
                  "allowed_mentions": {"parse": []}})
    except (discord.HTTPException, ValueError) as exc:
        raise RuntimeError(f"discord refused the buttons message: {exc}") from exc
    return f"{channel}:{msg['id']}"


async def close_buttons(client: discord.Client, message_id: str, text: str) -> None:
    """Edit ``<channel id>:<message id>`` to ``text`` without components. Raises
    RuntimeError."""
    channel, _, mid = message_id.partition(":")
    try:
        await client.http.request(
            discord.http.Route("PATCH", "/channels/{channel_id}/messages/{message_id}",
                               channel_id=int(channel), message_id=int(mid)),
            json={"content": literal(text), "components": []})
    except (discord.HTTPException, ValueError) as exc:
        raise RuntimeError(f"discord refused the edit: {exc}") from exc


def press_of(interaction: discord.Interaction, account_id: str) -> ButtonPress | None:
    """The press of a component interaction (None for any other interaction)."""
    if interaction.type != discord.InteractionType.component:
        return None
    data = interaction.data or {}
    answered = False

    async def answer(text: str) -> None:
        nonlocal answered
        if not answered and not interaction.response.is_done():
            answered = True
            await interaction.response.send_message(text or "OK", ephemeral=True)

    message = interaction.message
    return ButtonPress(
        channel="discord", action=str(data.get("custom_id") or ""),
        sender_id=str(interaction.user.id), account_id=account_id,
        sender_name=interaction.user.name, to=str(interaction.channel_id or ""),
        message_id=f"{interaction.channel_id}:{message.id}" if message else None,
        answer=answer)
