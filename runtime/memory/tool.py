"""The ``memory_search`` tool's arguments and result text (declared in
runtime/tools/sources.py, handled in runtime/tools/memory_tool.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from datetime import date, tzinfo
from typing import Any

from runtime.clock import parse_iso, utc_iso
from runtime.memory.keyword import MemoryIndex, Query
from runtime.memory.paragraphs import _local
from runtime.memory.search import HybridSearch


def _when(value: Any, name: str, zone: tzinfo) -> float | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise TypeError(f"memory_search: {name} must be a string (RFC 3339 or YYYY-MM-DD)")
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()):
            return _local(date.fromisoformat(value.strip()), None, zone)
        return parse_iso(value)
    except ValueError:
        raise ValueError(f"memory_search: {name} {value!r} is not RFC 3339 or YYYY-MM-DD") from None


async def run_memory_search_tool(index: MemoryIndex | HybridSearch, arguments: dict[str, Any],
                                 *, now: float, decay_lambda: float = 0.0,
                                 scopes: Collection[str] | None = None) -> str:
    """Execute a ``memory_search`` tool call; returns the JSON text handed to the model.

    ``scopes``: the scopes the asker sees (None: all). Result: ``{"results": [{"path",
    "line", "heading", "created_at" (RFC 3339 UTC), "score", "scope", "id"? (a scoped
    entry's id), "parts" {"bm25", "bm25_rank", "vector", "vector_rank", "rrf", "decay"},
    "text"}], "mode": "hybrid" | "bm25", "note"?}``. Raises ValueError for bad values and
    TypeError for wrong types (messages fit for the model).
    """
    limit = arguments.get("limit", 5)
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError("memory_search: limit must be an integer")
    search = index if isinstance(index, HybridSearch) else HybridSearch(index)
    zone = search.keyword.tz
    q = Query(now, _when(arguments.get("created_after"), "created_after", zone),
              _when(arguments.get("created_before"), "created_before", zone), scopes,
              decay_lambda)
    result = await search.search(str(arguments.get("query", "")), q, min(limit, 20))
    rows = []
    for h in result.hits:
        row: dict[str, Any] = {"path": h.path, "line": h.line, "heading": h.heading,
                               "created_at": utc_iso(h.created_at), "score": round(h.score, 6),
                               "scope": h.scope}
        if h.entry_id:
            row["id"] = h.entry_id
        row["parts"] = h.parts
        row["text"] = h.text
        rows.append(row)
    out: dict[str, Any] = {"results": rows, "mode": result.mode}
    if result.note:
        out["note"] = result.note
    return json.dumps(out, ensure_ascii=False)
