"""``tools/list`` that survives one malformed tool.

The SDK's ``ClientSession.list_tools`` validates the whole result at once: one tool whose
``inputSchema`` is a string (or any other malformed entry) fails the list, so the whole
server is treated as down and retried forever. Here the result is fetched raw and each tool
validated on its own: a malformed one is skipped with one ``mcp_tool_skipped`` warning
naming it, the rest of the server stays usable (MCP spec "Tools": ``tools/list`` result,
paginated by ``nextCursor``).
"""

from __future__ import annotations

from typing import Any

from mcp import ClientSession, types
from pydantic import BaseModel, ConfigDict, ValidationError


class _RawToolList(BaseModel):
    model_config = ConfigDict(extra="allow")
    tools: list[Any] = []
    nextCursor: str | None = None


def _tool_name(item: Any) -> str:
    return str(item.get("name")) if isinstance(item, dict) else repr(item)[:80]


async def list_tools(session: ClientSession, log: Any, *,
                     max_pages: int = 100) -> list[types.Tool]:
    """Every valid tool of every page (at most ``max_pages``). Raises what the request
    raises (McpError, TimeoutError); never ValidationError for a single tool."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(max_pages):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        raw = await session.send_request(
            types.ClientRequest(types.ListToolsRequest(params=params)), _RawToolList)
        for item in raw.tools:
            try:
                tools.append(types.Tool.model_validate(item))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                log.warning("mcp_tool_skipped", tool=_tool_name(item),
                            problem=f"{where}: {first['msg']}")
        cursor = raw.nextCursor
        if not cursor:
            break
    # call_tool validates structured results against these, and asks tools/list again
    # (strictly, which would fail) for a tool it has no entry for.
    schemas = getattr(session, "_tool_output_schemas", None)
    if isinstance(schemas, dict):
        for t in tools:
            schemas[t.name] = t.outputSchema
    return tools
