"""Slack names reactions by emoji *name* (reactions.add ``name``, e.g. ``eyes``), not by
the character: the ack/done emoji of the config map to their names here
(https://docs.slack.dev/reference/methods/reactions.add)."""

from __future__ import annotations

_NAMES = {"👀": "eyes", "✅": "white_check_mark", "👍": "+1", "🤔": "thinking_face",
          "⏳": "hourglass_flowing_sand", "🔧": "wrench", "✔️": "heavy_check_mark",
          "🙏": "pray", "🎉": "tada", "❤️": "heart", "🚀": "rocket", "⚡": "zap"}


def slack_emoji_name(emoji: str) -> str:
    """``👀`` -> ``eyes``; ``:eyes:`` or ``eyes`` pass through (without colons)."""
    emoji = emoji.strip()
    return _NAMES.get(emoji) or emoji.strip(":")
