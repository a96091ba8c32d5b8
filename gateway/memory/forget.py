"""Deleting memory entries: ``/forget`` in any chat (a sender sees and deletes their own
scope's entries; ``/forget group ...`` the group's, for owners) and ``tidegate memory
forget --user ID | --group CONVERSATION`` (operators).

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


async def forget_scopes(hub: Any, timeline: Any, agent_id: str, scopes: list[str],
                        ids: list[str] | None, by: dict[str, Any]) -> list[Any]:
    """:func:`forget` over several scopes of one person (``MemoryHub.user_scopes``: their
    own and those of the ids linked to them); one MEMORY_FORGET per scope that lost
    entries. Returns every deleted entry."""
    gone: list[Any] = []
    for scope in scopes:
        gone += await forget(hub, timeline, agent_id, scope, ids, by)
    return gone


async def person_entries(hub: Any, agent_id: str, scopes: list[str]) -> list[Any]:
    """The entries of all ``scopes`` (one person's), oldest first."""
    store = hub.store_for(agent_id)
    found = await asyncio.to_thread(lambda: [e for s in scopes for e in store.entries(s)])
    return sorted(found, key=lambda e: e.created_at)


async def chat_forget(hub: Any, timeline: Any, agent_id: str, msg: Any, args: str) -> str:
    """The reply to ``/forget [all | ID ...]`` from ``msg``'s sender (their own scopes:
    with an identity link, also those of the ids linked to them)."""
    user = hub.canonical(msg.channel, msg.sender_id)
    scopes = hub.user_scopes(user)
    words = args.split()
    keyword = [w.lower() for w in words[:1]]  # /forget ALL, /forget Group: any case
    if keyword == ["group"]:
        return await _group_forget(hub, timeline, agent_id, msg, user, words[1:])
    entries = await person_entries(hub, agent_id, scopes)
    if not words:
        if not entries:
            return "I have no notes saved about you."
        if msg.chat_type != "dm":
            return (f"I have {len(entries)} note(s) saved about you. Send /forget in a "
                    "direct message to see them, or /forget all here to delete them all.")
        listing = "\n".join(f"[{e.entry_id}] {hub.scrub(e.text)}" for e in entries)
        return (f"Notes saved about you ({len(entries)}):\n{listing}\n\n"
                "/forget ID deletes one, /forget all deletes them all.")
    ids = None if [w.lower() for w in words] == ["all"] else words
    by = {"by": "chat", "channel": msg.channel, "sender": user}
    gone = await forget_scopes(hub, timeline, agent_id, scopes, ids, by)
    if not gone:
        return "Nothing matched: /forget lists your notes and their ids."
    return f"Forgotten: {len(gone)} note(s). They are gone from my memory."


async def _group_forget(hub: Any, timeline: Any, agent_id: str, msg: Any, user: str,
                        words: list[str]) -> str:
    """``/forget group [all | ID ...]`` in a group: the group's scope, for the agent's
    owners only (a refusal is logged)."""
    from gateway.routing import canonical_id
    if msg.chat_type == "dm" or not msg.group_id:
        return "/forget group works in a group chat: it deletes that group's notes."
    if user not in hub.owners_of(agent_id):
        log.warning("memory_forget_refused", agent=agent_id, sender=user,
                    reason="not_owner", scope="group")
        return "Only the agent's owners can delete this group's notes."
    group = f"{msg.channel.lower()}:{canonical_id(msg.channel, msg.group_id)}"
    scope = f"group:{group}"
    if not words:
        entries = await asyncio.to_thread(hub.store_for(agent_id).entries, scope)
        if not entries:
            return "I have no notes saved for this group."
        listing = "\n".join(f"[{e.entry_id}] {hub.scrub(e.text)}" for e in entries)
        return (f"Notes saved for this group ({len(entries)}):\n{listing}\n\n"
                "/forget group ID deletes one, /forget group all deletes them all.")
    by = {"by": "chat", "channel": msg.channel, "sender": user}
    everything = [w.lower() for w in words] == ["all"]
    gone = await forget(hub, timeline, agent_id, scope, None if everything else words, by)
    if not gone:
        return "Nothing matched: /forget group lists this group's notes and their ids."
    return f"Forgotten: {len(gone)} group note(s)."
