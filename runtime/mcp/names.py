"""MCP tool names and schemas as the providers accept them: names ``^[a-zA-Z0-9_-]{1,64}$``
(OpenAI and Anthropic alike), JSON Schemas reduced to an ``object`` with ``properties``."""

from __future__ import annotations

import hashlib
import re
from typing import Any

MAX_NAME = 64
_BAD = re.compile(r"[^a-zA-Z0-9_-]+")
_DROP_KEYS = {"$schema", "$id", "$comment"}


def tool_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>`` with other characters replaced by ``_``; a name longer than
    64 characters keeps its start and gets an 8-hex hash of the full name, so two long
    names never collide."""
    name = f"mcp__{_BAD.sub('_', server)}__{_BAD.sub('_', tool)}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:MAX_NAME - 9]}_{digest}"


def unique_tool_name(server: str, tool: str, taken: set[str]) -> str:
    """:func:`tool_name`, or — when another tool already has that name (``get.file`` and
    ``get_file`` sanitise alike; so do server ``a`` tool ``b__c`` and server ``a__b``
    tool ``c``) — its start plus an 8-hex hash of server and tool, so neither is hidden."""
    name = tool_name(server, tool)
    if name not in taken:
        return name
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{name[:MAX_NAME - 9]}_{digest}"


def group_of(server: str) -> str:
    """The tool-policy group of a server's tools."""
    return f"plugin:mcp:{server}"


def normalise_schema(schema: Any) -> dict[str, Any]:
    """An ``inputSchema`` providers accept: a JSON object schema with ``properties`` (also
    when the server sent none, or a non-object root), without ``$schema``-style keys.
    ``properties`` that is no object (a list, say: a schema-validating provider would
    refuse every turn that offers the tool) is rebuilt from what it holds — ``{"name":
    ..., ...}`` items by their name — or left empty; see :func:`schema_problem`."""
    if not isinstance(schema, dict):
        return {"type": "object", "properties": {}}
    out = {k: v for k, v in schema.items() if k not in _DROP_KEYS}
    if out.get("type") != "object":
        return {"type": "object", "properties": {"input": out}, "required": ["input"]}
    props = out.setdefault("properties", {})
    if not isinstance(props, dict):
        items = props if isinstance(props, list) else []
        out["properties"] = {str(p["name"]): {k: v for k, v in p.items() if k != "name"}
                             for p in items if isinstance(p, dict) and p.get("name")}
        if not isinstance(out.get("required"), list):
            out.pop("required", None)
    if isinstance(out.get("required"), list):
        out["required"] = [r for r in out["required"] if r in out["properties"]]
    return out


def schema_problem(schema: Any) -> str | None:
    """What :func:`normalise_schema` had to repair in ``schema`` (for one diagnostic), or
    None when it was a usable object schema."""
    if not isinstance(schema, dict):
        return f"inputSchema is a {type(schema).__name__}, not an object"
    props = schema.get("properties")
    if props is not None and not isinstance(props, dict):
        return f"inputSchema.properties is a {type(props).__name__}, not an object"
    return None
