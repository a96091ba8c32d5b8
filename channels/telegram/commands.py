"""Telegram's command menu (issue 13 "Commands, natively registered"): ``setMyCommands``
once per scope — private chats get the DM menu, groups also ``/activation``, the default
scope the DM menu for anything else
(https://core.telegram.org/bots/api#setmycommands, #botcommandscope)."""

from __future__ import annotations

from telegram import (
    Bot,
    BotCommand,
    BotCommandScopeAllGroupChats,
    BotCommandScopeAllPrivateChats,
    BotCommandScopeDefault,
)

from channels.inbound.commands import menu


async def register_commands(bot: Bot) -> None:
    """Set the menus; raises what python-telegram-bot raises (the caller logs it)."""
    scopes = ((BotCommandScopeDefault(), "dm"), (BotCommandScopeAllPrivateChats(), "dm"),
              (BotCommandScopeAllGroupChats(), "group"))
    for scope, chat in scopes:
        await bot.set_my_commands([BotCommand(c.name, c.description) for c in menu(chat)],
                                  scope=scope)
