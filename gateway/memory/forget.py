"""Deleting memory entries: ``/forget`` in any chat (a sender sees and deletes their own
scope's entries) and ``tidegate memory forget --user ID`` (operators).

A deletion removes the entries from the scope's file (atomic rewrite) and their vectors
from the index, then appends a ``MEMORY_FORGET`` event — scope, entry ids, how many, who
asked; never the deleted text — to the agent's memory timeline (session key
``agent:<agent>:memory``, created on the first deletion). The conversation's transcript
and timeline are append-only by design and keep what was said in the chat itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

log = structlog.get_logger(__name__)


def memory_timeline(agent_id: str) -> tuple[str, str]:
    """(session id, session key) of an agent's memory timeline."""
    return f"memory-{agent_id}", f"agent:{agent_id}:memory"


async def record_forget(timeline: Any, agent_id: str, content: dict[str, Any]) -> None:
    """Append MEMORY_FORGET to the agent's memory timeline (created when missing).
    ``timeline`` None (timeline disabled): logged only."""
    if timeline is None:
        return
    from runtime.timeline import TimelineNotFoundError
    sid, key = memory_timeline(agent_id)
    try:
        await timeline.append_event(sid, "MEMORY_FORGET", content)
    except TimelineNotFoundError:
        await timeline.init_timeline(sid, key)
        await timeline.append_event(sid, "MEMORY_FORGET", content)


async def forget(hub: Any, timeline: Any, agent_id: str, scope: str,
                 ids: list[str] | None, by: dict[str, Any]) -> list[Any]:
    """Delete ``ids`` (None: all) of ``scope``; returns the deleted entries. Raises
    ValueError for a malformed scope."""
    store = hub.store_for(agent_id)
    gone = await asyncio.to_thread(store.forget, scope, ids)
    if not gone:
        return []
    await hub.search_for(agent_id).prune()
    content = {"scope": scope, "entry_ids": [e.entry_id for e in gone], "count": len(gone),
               **by}
    await record_forget(timeline, agent_id, content)
    log.info("memory_forgotten", agent=agent_id, scope=scope, count=len(gone), **by)
    return gone


async def chat_forget(hub: Any, timeline: Any, agent_id: str, msg: Any, args: str) -> str:
    """The reply to ``/forget [all | ID ...]`` from ``msg``'s sender (their own scope)."""
    user = hub.canonical(msg.channel, msg.sender_id)
    scope = f"user:{user}"
    store = hub.store_for(agent_id)
    entries = await asyncio.to_thread(store.entries, scope)
    words = args.split()
    if not words:
        if not entries:
            return "I have no notes saved about you."
        if msg.chat_type != "dm":
            return (f"I have {len(entries)} note(s) saved about you. Send /forget in a "
                    "direct message to see them, or /forget all here to delete them all.")
        listing = "\n".join(f"[{e.entry_id}] {e.text}" for e in entries)
        return (f"Notes saved about you ({len(entries)}):\n{listing}\n\n"
                "/forget ID deletes one, /forget all deletes them all.")
    ids = None if words == ["all"] else words
    by = {"by": "chat", "channel": msg.channel, "sender": user}
    gone = await forget(hub, timeline, agent_id, scope, ids, by)
    if not gone:
        return "Nothing matched: /forget lists your notes and their ids."
    return f"Forgotten: {len(gone)} note(s). They are gone from my memory."
