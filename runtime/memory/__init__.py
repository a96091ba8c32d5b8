"""Agent memory (seed 003 memory layers, seed 002 time windows and decay): paragraphs of
the memory files and scoped entries (``paragraphs``, ``scopes``), BM25 (``keyword``),
embeddings and the vector index (``embeddings``, ``vectors``), hybrid ranking
(``search``) and the ``memory_search`` tool text (``tool``). docs/memory.md is the user
guide.

The names below load their module on first use: ``runtime.memory.scopes`` (what every
platform turn's prompt needs) stays free of numpy and the BM25 library.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"MemoryIndex": "keyword", "Query": "keyword", "Hit": "paragraphs",
          "Paragraph": "paragraphs", "parse_paragraphs": "paragraphs",
          "tokenize": "paragraphs", "run_memory_search_tool": "tool"}

__all__ = ["Hit", "MemoryIndex", "Paragraph", "Query", "parse_paragraphs",
           "run_memory_search_tool", "tokenize"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'runtime.memory' has no attribute {name!r}")
    return getattr(importlib.import_module(f"runtime.memory.{_WHERE[name]}"), name)
