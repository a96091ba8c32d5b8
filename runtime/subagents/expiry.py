"""When a subagent run expires (seed 001 §6 lifecycle constants).

- announce expiry: a finished run not announced within :data:`ANNOUNCE_EXPIRY` of its end
  is given up (state ``expired``);
- hard expiry: any run still going :data:`HARD_EXPIRY` after it was created is killed and
  marked ``timeout``;
- orphans: a run whose requester session ended, was reset or no longer exists is marked
  ``error`` and cleaned up (checked by the service, which knows the sessions).
"""

from __future__ import annotations

from runtime.subagents.records import RunRecord

ANNOUNCE_EXPIRY = 300.0
HARD_EXPIRY = 1800.0
SWEEP_INTERVAL = 15.0  # seconds between expiry/orphan sweeps


def hard_expired(rec: RunRecord, now: float) -> bool:
    return rec.active and now - rec.created_at >= HARD_EXPIRY


def announce_expired(rec: RunRecord, now: float) -> bool:
    return (not rec.active and rec.announce_state == "pending" and rec.ended_at is not None
            and now - rec.ended_at >= ANNOUNCE_EXPIRY)
