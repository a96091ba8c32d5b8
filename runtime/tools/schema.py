"""Tool schemas per provider, in one place (seed 001 §3 "Provider adaptation").

Anthropic (``input_schema``) takes the full JSON Schema as the tool declares it. The
OpenAI path (Chat Completions ``function.parameters``; also OpenAI-compatible servers)
drops what OpenAI's strict function-calling mode rejects: keywords outside the
supported subset (``format``, ``pattern``, length/range/size limits, ``default``,
``examples``, ``$schema``, ``if/then/else`` ...), recursively. MCP servers and plugins
routinely send such schemas.

Source: https://platform.openai.com/docs/guides/structured-outputs#supported-schemas ;
https://docs.anthropic.com/en/docs/build-with-claude/tool-use
"""

from __future__ import annotations

from typing import Any

OPENAI_DROPPED = frozenset({
    "$schema", "$id", "$comment", "default", "examples", "format", "pattern",
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties",
    "patternProperties", "propertyNames", "unevaluatedProperties", "contentEncoding",
    "contentMediaType", "if", "then", "else", "not", "dependentRequired",
    "dependentSchemas", "readOnly", "writeOnly", "deprecated", "title",
})
# Keys whose values are maps of name -> schema (a property may be called "format").
_SCHEMA_MAPS = ("properties", "$defs", "definitions")


def tool_schema_for(api: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The schema to send to a provider speaking ``api`` (``"openai"`` or
    ``"anthropic"``); the input is never modified. Unknown APIs get the schema as is."""
    if api == "openai":
        return _strip(schema)
    return schema


def _strip(node: Any) -> Any:
    if isinstance(node, list):
        return [_strip(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in OPENAI_DROPPED:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _strip(sub) for name, sub in value.items()}
        else:
            out[key] = _strip(value)
    if out.get("type") == "object" and "properties" not in out:
        out["properties"] = {}  # OpenAI rejects an object schema without properties
    return out
