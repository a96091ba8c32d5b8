"""``cluster:`` config (issue 15 "Replicas"): used only with ``storage.backend: postgres``."""


from pydantic import Field

from runtime.config_types import ConfigModel, Duration


class ClusterSection(ConfigModel):
    """``lease_ttl``: a replica whose heartbeat row is older than this is presumed dead and
    its accounts, lanes and unfinished work are taken over (seconds). ``replica_id``: this
    process's id (default ``$TIDEGATE_REPLICA_ID``, else ``<host>-<pid>``)."""

    lease_ttl: Duration = Field(15.0, gt=0,
        description=("a replica whose heartbeat row is this old is presumed dead: its accounts, "
                     "lanes, queued work and cron runs are taken over (and fenced: if it was only "
                     "paused, its later reply marks and offset commits are refused)."))
    replica_id: str | None = Field(
        None,
        description="default $TIDEGATE_REPLICA_ID, else <host>-<pid>.")
