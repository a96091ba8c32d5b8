"""Tainted turns (docs/exec.md): which tool results bring content from outside the trust
boundary into a turn, and how the request names it.

``web_fetch`` (a page), ``web_search`` (results) and every MCP tool (an MCP server's
answer) taint the turn that called them. Messages from senders who are not owners taint
the turn from its start (the gateway sets ``TurnInput.tainted_by``). Once tainted, a
side-effecting tool needs an approval (``tools.taint.mode: ask``) or is refused (``deny``),
allowlist or not; the gateway's gate (gateway/approvals/service.py) decides.
"""

from __future__ import annotations

from typing import Any

from runtime.tools.registry import Tool


def taint_of(tool: Tool, args: dict[str, Any]) -> str | None:
    """What calling ``tool`` with ``args`` brought into the turn ("web_fetch of
    https://example.org/"), or None when its result is trusted."""
    if tool.name == "web_fetch":
        return f"web_fetch of {str(args.get('url') or '')[:200]}"
    if tool.name == "web_search":
        return f"web_search for {str(args.get('query') or '')[:100]!r}"
    if tool.source.startswith("plugin:mcp"):
        return f"the MCP tool {tool.name}"
    return None
