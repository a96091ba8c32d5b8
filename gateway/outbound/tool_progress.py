"""Tool progress lines (issue 13 "/verbose"): while a verbose session's turn runs tools, one
status message shows the tool at work ("🔧 read notes.md", "🔧 exec pytest"), edited in
place through the platform's stream sender (throttled like a streamed reply,
channels/outbound/streaming.py); when the turn ends it keeps a one-line summary of the steps.
``/verbose on|off`` sets it per session, ``channels.<p>.tool_progress`` is the default.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from channels.outbound.streaming import ReplyStream

_ARG_KEYS = ("path", "file", "file_path", "command", "cmd", "query", "url", "pattern",
             "name", "target", "message")
LABEL_CHARS = 60


def tool_label(tool: str, arguments: Any) -> str:
    """``read`` + ``{"path": "notes.md"}`` -> ``read notes.md``: the tool and its most
    telling argument, one line, at most LABEL_CHARS characters."""
    args = arguments
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            args = {}
    detail = ""
    if isinstance(args, dict):
        for key in _ARG_KEYS:
            if isinstance(args.get(key), (str, int, float)) and str(args[key]).strip():
                detail = " ".join(str(args[key]).split())
                break
    label = f"{tool} {detail}".strip()
    return label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…"


class ToolProgress:
    """The status message of one turn (a partial-mode :class:`ReplyStream`)."""

    def __init__(self, stream: ReplyStream) -> None:
        self.stream = stream
        self.steps: list[str] = []

    def start(self) -> None:
        self.stream.start()

    def tool_started(self, tool: str, arguments: Any) -> None:
        self.steps.append(tool_label(tool, arguments))
        self.stream.replace(f"🔧 {self.steps[-1]}")

    def summary(self) -> str:
        return "🔧 " + " · ".join(dict.fromkeys(self.steps)) if self.steps else ""

    async def close(self) -> None:
        """Leave the summary line (nothing when no tool ran)."""
        text = self.summary()
        if not text:
            await self.stream.discard()
        else:
            await self.stream.finish(text)  # on failure the stream removes what it showed


def verbose_command(args: str, current: bool | None) -> tuple[str, bool | None]:
    """``/verbose [on|off]`` -> (reply, new setting or None when unchanged)."""
    arg = args.strip().lower()
    if arg in ("on", "off"):
        on = arg == "on"
        return (f"Tool progress {'on' if on else 'off'} for this session.", on)
    state = "on" if current else "off" if current is not None else "the channel default"
    return f"Tool progress: {state}. Use /verbose on or /verbose off.", None
