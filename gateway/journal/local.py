"""The outcome of a local message whose caller the process died on (docs/outcomes.md
"Local callers after a crash").

A message of the CLI, webchat or the OpenAI API is accepted once it is queued on its
session's lane; the intake journal then holds a ``local`` record of it
(gateway/journal/store.py), closed by its outcome row. Such a message is not resumed
after a crash: its caller waited on the connection the crash dropped, and nobody is left
to take the answer (a platform message, by contrast, has a chat to answer in). So a
``local`` record still open when the gateway starts is recorded ``failed`` with
:data:`LOST_DETAIL`: the caller saw the connection drop and got no answer, like a caller
the gateway stopped on.
"""

from __future__ import annotations

from typing import Any

import structlog

log = structlog.get_logger(__name__)

LOST_DETAIL = ("the gateway died while the caller waited (found at the next start); the "
               "caller's connection dropped and it got no answer; send it again")


def record_lost_local(gw: Any) -> int:
    """Record ``failed`` for every local message the last run accepted and never ended
    (``gw`` offers ``journal`` and ``outcomes``, the agents built). Call at start, before
    the HTTP server takes new requests. Returns how many."""
    journal = getattr(gw.outcomes, "journal", None)
    if journal is None:
        return 0
    lost = journal.local_unfinished()
    for entry in lost:
        gw.outcomes.record_message(
            {"channel": entry.work.get("channel"), "agent": entry.work.get("agent_id"),
             "accepted_at": entry.accepted_at, "run_id": entry.run_id,
             "local_id": entry.id},
            "failed", LOST_DETAIL, session_key=entry.session_key)
    if lost:
        log.warning("local_messages_lost_at_crash", count=len(lost),
                    session_keys=sorted({e.session_key for e in lost}))
    return len(lost)
