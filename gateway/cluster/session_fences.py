"""A session's own writes under its lane lease (issue 15 "Lanes"; README "Replicas"): the
timeline events, transcript lines and session-store row of a session whose lane this
replica runs
carry the lane lease generation (:class:`gateway.cluster.fencing.LaneFences`), and
PostgreSQL refuses them once another replica took the lane over
(``runtime/storage/postgres/fence.py``): a replica paused past ``cluster.lease_ttl``
cannot append to the timeline or write the row the new owner now writes. A refusal is
logged by the store (``timeline_append_fenced``, ``session_write_fenced``) and the lane is
dropped here. Taking a lane reads the session's row first (the previous owner's) and
drops the transcript log cached here, and giving one back writes this replica's changes
first.
"""

from __future__ import annotations

from typing import Any

import structlog

from gateway.cluster.work import ClusterWork

log = structlog.get_logger(__name__)


def wire(gw: Any, work: ClusterWork) -> None:
    """Hook the fences into the gateway's timeline hooks and every agent's session store."""
    def drop(key: str) -> None:
        if key in work.held:
            work.lane_lost(key)

    async def taken(key: str) -> None:
        # a log kept here from an earlier holding (e.g. reopened by a turn that was
        # already queued when the lane was forgotten) misses what the other replica
        # wrote since: the next turn reads the transcript from the store
        gw.logs.forget_key(key)
        for agent in gw.agents.values():
            await agent.store.reload(key)

    async def released(key: str) -> None:
        for agent in gw.agents.values():
            try:
                await agent.store.flush()
            except OSError as exc:  # the lane stays here until the row is written
                log.warning("cluster_lane_release_deferred", session_key=key,
                            error=str(exc))
                raise

    work.on_lane_taken, work.on_lane_release = taken, released
    hooks = gw.timeline_hooks
    if hooks is not None:
        hooks.fence, hooks.on_fenced = work.fences.token, drop
    if hasattr(gw.logs.transcripts, "fence"):  # PostgreSQL transcripts
        gw.logs.transcripts.fence = work.fences.token
    for agent in gw.agents.values():
        agent.store.fence = work.fences.token
        agent.store.on_fenced = lambda keys: [drop(k) for k in keys]


async def settle(gw: Any) -> None:
    """Before this replica gives its leases back (a clean stop): what it queued under
    them — session rows, timeline events, transcript lines — is written while the fences
    still hold (afterwards PostgreSQL would refuse it)."""
    for agent in gw.agents.values():
        try:
            await agent.store.flush()
        except OSError as exc:
            log.warning("cluster_stop_unflushed", store="sessions", error=str(exc))
    if gw.timeline_hooks is not None:
        await gw.timeline_hooks.flush()
    flush = getattr(gw.logs.transcripts, "flush", None)
    if flush is not None:
        await flush()
