"""``cluster:`` config (issue 15 "Replicas"): used only with ``storage.backend: postgres``."""


from pydantic import Field

from runtime.config_types import ConfigModel, Duration


class ClusterSection(ConfigModel):
    """``lease_ttl``: a replica whose heartbeat row is older than this is presumed dead and
    its accounts, lanes and unfinished work are taken over (seconds). ``replica_id``: this
    process's id (default ``$TIDEGATE_REPLICA_ID``, else ``<host>-<pid>``)."""

    lease_ttl: Duration = Field(15.0, gt=0)
    replica_id: str | None = None
