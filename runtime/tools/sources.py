"""Tool sources assembled in their fixed order (seed 001 §3): core (read, write, edit,
apply_patch), runtime (exec, process), messaging (message), memory (memory_search,
memory_get, memory_write), automation (cron), sessions (sessions_*, session_status),
channel tools (react, pin, thread_create — only in turns from their platforms), then
plugin tools, which register at run time through
``ToolRegistry.register_plugin("mcp:<server>", tools)``.
"""

from __future__ import annotations

from runtime.tools.channel import CHANNEL_TOOLS
from runtime.tools.cron_tool import CRON_TOOL
from runtime.tools.exec import EXEC_TOOL
from runtime.tools.fs import FS_TOOLS
from runtime.tools.memory_tool import MEMORY_TOOLS
from runtime.tools.message import MESSAGE_TOOL
from runtime.tools.patch import APPLY_PATCH_TOOL
from runtime.tools.process import PROCESS_TOOL
from runtime.tools.registry import Tool, ToolRegistry
from runtime.tools.sessions import SESSIONS_TOOLS


def builtin_tools() -> list[Tool]:
    """Every built-in tool, in source order."""
    return [*FS_TOOLS, APPLY_PATCH_TOOL, EXEC_TOOL, PROCESS_TOOL, MESSAGE_TOOL,
            *MEMORY_TOOLS, CRON_TOOL, *SESSIONS_TOOLS, *CHANNEL_TOOLS]


def builtin_registry() -> ToolRegistry:
    """A registry holding the built-in tools (plugin tools are added later)."""
    return ToolRegistry(builtin_tools())
