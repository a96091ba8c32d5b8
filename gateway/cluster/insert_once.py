"""Writing the ``cluster_work`` row of work nobody redelivers exactly once: a waiting
caller's message (webchat, the OpenAI API, the CLI, the control API;
gateway/cluster/forwarding.py) and a session command (commands.py).

The insert waits out a PostgreSQL outage (:meth:`ClusterDB.retry`). An answer lost after
the insert committed (the server stopped or the connection was cut between its commit and
its reply) would make the retry write a SECOND row for the same message, which a
restart's takeover then runs as a second turn with a second outcome. So each insert
carries a key of its own in the row's unique ``dedupe`` column (``once:<32 hex>``, made
once per insert, before the first attempt; platform messages use that column for their
inbound key, which never has this prefix), and a retry that finds the key gets the id of
the row its lost answer named instead of a new row.
"""

from __future__ import annotations

import uuid
from typing import Any

INSERT_ONCE = (
    "INSERT INTO cluster_work (session_key, work, target, state, dedupe) VALUES "
    "($1, $2::jsonb, $3, 'accepted', $4) "
    # the row a lost answer named: its id again (the no-op update locks and returns it)
    "ON CONFLICT (dedupe) DO UPDATE SET dedupe = EXCLUDED.dedupe RETURNING id")
PREFIX = "once:"


def once_key() -> str:
    """A fresh idempotency key for one insert (``once:`` + 32 hex digits)."""
    return PREFIX + uuid.uuid4().hex


async def insert_row(db: Any, session_key: str, payload: str, replica: str, *,
                     what: str) -> int:
    """Write one ``accepted`` row of ``session_key`` with ``payload`` (the work as JSON
    text) targeted at ``replica``; returns its id. ``db``: the ClusterDB; waits while
    PostgreSQL is unreachable (``what`` names the wait in the log), and a retry after a
    lost answer returns the row written then. Raises asyncpg errors the database gives."""
    key = once_key()  # one per insert, the same for every attempt
    return int(await db.retry(lambda c: c.fetchval(INSERT_ONCE, session_key, payload,
                                                   replica, key), what=what))
