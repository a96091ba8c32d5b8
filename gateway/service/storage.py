"""Which stores the gateway opens for ``storage.backend`` (issue 15): the glue between the
daemon and ``runtime.storage``. Embedded: nothing here (each service opens its files under
the state dir). PostgreSQL: the daemon's pool (``Gateway.pg``, opened and migrated at
start) for the async stores, one shared :class:`SyncBridge` for the blocking ones.
"""

from __future__ import annotations

from typing import Any

from gateway.sessions.store import SessionStore, open_session_store, session_db_path

Gateway = Any  # gateway.service.daemon.Gateway (not imported: the daemon imports this module)


def bridge(gw: Gateway) -> Any:
    """The gateway's SyncBridge, opened on first use. Raises StorageUnavailable."""
    if gw.pg_bridge is None:
        from runtime.storage.postgres.bridge import SyncBridge
        # 4: a pairing write holds one connection while its read takes another
        gw.pg_bridge = SyncBridge(gw.config.storage.dsn or "", max_size=4,
                                  timeout=gw.config.storage.pool.connect_timeout)
    return gw.pg_bridge


def session_store(gw: Gateway, agent_id: str) -> SessionStore | None:
    """``agent_id``'s session store on PostgreSQL, loaded; None on embedded storage (the
    agent builder opens ``sessions.db``)."""
    if gw.pg is None:
        return None
    from runtime.storage.postgres.sessions import PgSessionRecords
    return open_session_store(session_db_path(gw.state_dir, agent_id), agent_id,
                              clock=gw.clock, records=PgSessionRecords(bridge(gw), agent_id))


def transcript_store(gw: Gateway) -> Any:
    """The transcript store (runtime/storage/transcripts.py): JSONL files under the state
    dir, or PostgreSQL (writes on the gateway's pool, reads through the bridge)."""
    if gw.pg is None:
        from runtime.storage.embedded.transcripts import FileTranscripts
        return FileTranscripts(gw.state_dir)
    from runtime.storage.postgres.transcripts import PgTranscripts
    return PgTranscripts(bridge(gw), gw.pg, clock=gw.clock)


def offline_transcripts(loaded: Any) -> tuple[Any, Any]:
    """(transcript store, closer) for the CLI without the daemon, on the configured
    backend. Raises StorageUnavailable when PostgreSQL cannot be reached."""
    if loaded.config.storage.backend != "postgres":
        from runtime.storage.embedded.transcripts import FileTranscripts
        return FileTranscripts(loaded.state_dir), lambda: None
    from runtime.storage.postgres.bridge import SyncBridge
    from runtime.storage.postgres.transcripts import PgTranscripts
    door = SyncBridge(loaded.config.storage.dsn or "",
                      timeout=loaded.config.storage.pool.connect_timeout)
    return PgTranscripts(door), door.close


def offline_sessions(loaded: Any, agent_id: str, now: float) -> dict[str, Any]:
    """An agent's sessions read without the daemon (the CLI), from the configured backend.
    Raises SessionStoreError (PostgreSQL unreachable included)."""
    from gateway.sessions.store import read_sessions
    if loaded.config.storage.backend != "postgres":
        return read_sessions(loaded.state_dir, agent_id, now)
    from runtime.storage.postgres.bridge import SyncBridge
    from runtime.storage.postgres.errors import StorageUnavailable
    from runtime.storage.postgres.sessions import PgSessionRecords
    from runtime.storage.sessions import SessionStoreError
    try:
        door = SyncBridge(loaded.config.storage.dsn or "",
                          timeout=loaded.config.storage.pool.connect_timeout)
    except StorageUnavailable as exc:
        raise SessionStoreError(str(exc), path="postgresql", fix="start PostgreSQL or fix "
                                "storage.dsn") from None
    try:
        return read_sessions(loaded.state_dir, agent_id, now,
                             records=PgSessionRecords(door, agent_id))
    finally:
        door.close()


def records(gw: Gateway, name: str, **opts: Any) -> Any:
    """Store ``name``'s PostgreSQL backend (``runtime.storage.postgres.stores``), or None
    on embedded storage (the service opens its files). Raises StorageUnavailable."""
    if gw.pg is None:
        return None
    from gateway.cluster.membership import default_replica_id
    from runtime.storage.postgres.stores import open_records
    return open_records(name, bridge(gw), replica=default_replica_id(
        gw.config.cluster.replica_id), **opts)


def cron_store(gw: Gateway) -> Any:
    """The cron job store: ``cron/jobs.json`` on embedded storage, the shared
    ``cron_jobs`` table on PostgreSQL."""
    from scheduler.cron.store import CronStore
    pg = records(gw, "cron")
    return CronStore(gw.state_dir / "cron" / "jobs.json") if pg is None else \
        CronStore(records=pg)


def outbox(gw: Gateway) -> Any:
    """The outbox: ``outbox/`` files, or the ``outbox`` table (rows owned by this
    replica)."""
    from channels.outbound.outbox import Outbox
    return Outbox(gw.state_dir / "outbox", gw.clock, problems=gw.problems,
                  records=records(gw, "outbox", ttl=float(gw.config.cluster.lease_ttl)))


def dedupe(gw: Gateway) -> Any:
    """The inbound dedupe ledger (None, reported, when unusable)."""
    from channels.inbound.dedupe import open_dedupe
    return open_dedupe(gw.state_dir / "channels" / "inbound-seen.jsonl", gw.clock,
                       gw.problems, records=records(gw, "dedupe"))


def offline_bridge(loaded: Any) -> Any:
    """A SyncBridge for a CLI command on PostgreSQL storage, or None on embedded. The
    caller closes it. Raises StorageUnavailable."""
    if loaded.config.storage.backend != "postgres":
        return None
    from runtime.storage.postgres.bridge import SyncBridge
    return SyncBridge(loaded.config.storage.dsn or "",
                      timeout=loaded.config.storage.pool.connect_timeout)


def offline_records(loaded: Any, name: str) -> Any:
    """Store ``name``'s PostgreSQL backend for a CLI command, or None on embedded storage
    (the command reads the files). Raises StorageUnavailable."""
    door = offline_bridge(loaded)
    if door is None:
        return None
    from runtime.storage.postgres.stores import open_records
    return open_records(name, door, replica="cli")
