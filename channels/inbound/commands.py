"""The chat commands every channel offers (issue 13 "Commands, natively registered"): one
catalogue for the intake's parser, ``/help`` and each platform's native registration
(Telegram ``setMyCommands`` per scope; channels/telegram/adapter.py).

``scope``: ``all`` (DMs and groups) or ``group`` (only meaningful in groups, e.g.
``/activation``). Descriptions stay within Telegram's 3-256 characters.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ChatCommand:
    name: str
    description: str
    usage: str = ""  # argument hint for /help
    scope: str = "all"  # all | group


CATALOGUE: tuple[ChatCommand, ...] = (
    ChatCommand("new", "Start a new session"),
    ChatCommand("reset", "Reset this session"),
    ChatCommand("end", "End this session"),
    ChatCommand("stop", "Stop the running turn", "[all]"),
    ChatCommand("status", "Show session status"),
    ChatCommand("model", "Show or switch the model", "[ref|list|default]"),
    ChatCommand("think", "Reasoning effort", "off|low|medium|high"),
    ChatCommand("compact", "Compact the context now"),
    ChatCommand("fork", "Go on in a new session with the first N turns", "[N]"),
    ChatCommand("rewind", "Go back to turn N (later turns are kept)", "N"),
    ChatCommand("usage", "Tokens and cost"),
    ChatCommand("verbose", "Show tool progress", "on|off"),
    ChatCommand("activation", "Answer on mention or always", "mention|always", "group"),
    ChatCommand("subagents", "Subagent runs", "[kill ID]"),
    ChatCommand("forget", "See or delete what I remember about you", "[all|ID|group]"),
    ChatCommand("help", "Show help"),
)


def menu(chat: str) -> list[ChatCommand]:
    """The commands shown in ``chat`` (``dm`` | ``group``) menus."""
    return [c for c in CATALOGUE if c.scope == "all" or chat == "group"]
