"""The gateway's side of agent memory: who asks (identity links, owners), each agent's
search and scoped store, the per-sender prompt notes, ``/forget`` and the deletions'
timeline events (runtime/memory/ has the search itself; docs/memory.md the guide)."""

from gateway.memory.hub import MemoryHub

__all__ = ["MemoryHub"]
