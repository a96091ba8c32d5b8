"""Which job definitions a replica adopts from a shared cron store (issue 15 "Cron and
heartbeat"): with ``storage.backend: postgres`` every replica runs the same jobs, and a
job added, edited or removed through one replica's CLI or control API reaches the others
(``CronService.sync``). Due times still fire once cluster-wide: the occurrence ledger
(``gateway.cluster.occurrences``) decides who runs each one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the job model loads with the first job (issue 9, cold start)
    from scheduler.cron.job import CronJob


def plan(local: dict[str, CronJob], stored: list[CronJob]
         ) -> tuple[list[CronJob], list[str]]:
    """(jobs to take from the store: new here or with a newer definition, ids to drop:
    gone from the store). ``updated_at`` orders definitions; run state (next run, last
    status) of a job whose definition did not change stays this replica's."""
    adopt = [j for j in stored
             if j.id not in local or (j.updated_at or 0.0) > (local[j.id].updated_at or 0.0)]
    ids = {j.id for j in stored}
    return adopt, [i for i in local if i not in ids]
