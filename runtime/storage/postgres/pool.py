"""The asyncpg connection pool of one gateway process.

``open_database`` connects, applies pending migrations (``migrate.migrate``, under the
advisory lock) and returns the pool; every PostgreSQL store takes that pool. Errors are
:class:`StorageUnavailable` with the DSN redacted (its password never reaches a log line).
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

import asyncpg
import structlog

from runtime.storage.postgres.errors import StorageUnavailable

if TYPE_CHECKING:
    from runtime.storage.config import StorageSection

log = structlog.get_logger(__name__)

_URL_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@?#]*:)[^@/?#]*@")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


# What a statement raises when PostgreSQL is unreachable or refuses it: the stores map
# these to their own errors (OSError, a retry). InternalClientError belongs here: a
# restart ends every backend with a FATAL error and asyncpg may hand out a pooled
# connection that has read it but not yet seen its socket close; its next statement
# raises InternalClientError ("cannot switch to state 11; another operation (2) is in
# progress") before anything is sent, and the release terminates that connection.
DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError,
             OSError, TimeoutError)

# Not reached, or not accepting connections yet: worth another try (runtime/storage/postgres/
# wait.py). A refused login or a missing database is not.
TRANSIENT = (OSError, TimeoutError, asyncpg.CannotConnectNowError,
             asyncpg.TooManyConnectionsError, asyncpg.ConnectionDoesNotExistError)
_UNSET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def check_dsn(dsn: str) -> None:
    """Raises StorageUnavailable naming the variable when ``dsn`` still holds a
    ``${VAR}``: CLI commands load the config without requiring every variable
    (gateway/config/load.py ``strict_env=False``), so an unset ``TIDEGATE_PG_DSN`` (kept
    in the service's EnvironmentFile, not in the shell) arrives here as written."""
    if m := _UNSET_REF.search(dsn):
        raise StorageUnavailable(
            f"storage.dsn is {redact_dsn(dsn)!r}: environment variable {m.group(1)} is not "
            "set; the service reads it from its EnvironmentFile, a shell needs it exported "
            "(e.g. set -a; . <state_dir>/tidegate.env; set +a)")


def redact_dsn(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***`` (URL, query or key=value form)."""
    if "://" in dsn:
        return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", dsn))
    return _KV_PASSWORD.sub(r"\1***", dsn)


async def open_pool(section: StorageSection) -> asyncpg.Pool:
    """A pool of ``pool.min``..``pool.max`` connections to ``section.dsn``.

    Raises StorageUnavailable when the server cannot be reached within
    ``pool.connect_timeout`` seconds or refuses the login."""
    dsn = section.dsn or ""
    check_dsn(dsn)
    try:
        return await asyncio.wait_for(asyncpg.create_pool(
            dsn, min_size=section.pool.min, max_size=section.pool.max,
            timeout=section.pool.connect_timeout, command_timeout=60),
            section.pool.connect_timeout + 5)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError,
            ValueError) as exc:
        raise StorageUnavailable(f"PostgreSQL at {redact_dsn(dsn)} is unavailable: "
                                 f"{type(exc).__name__}: {redact_dsn(str(exc))}",
                                 transient=isinstance(exc, TRANSIENT)) from None


async def open_database(section: StorageSection) -> asyncpg.Pool:
    """Open the pool and bring the schema up to date (safe with several replicas starting
    at once). Raises StorageUnavailable, or MigrationError when the schema is unusable."""
    from runtime.storage.postgres.migrate import migrate
    pool = await open_pool(section)
    try:
        async with pool.acquire() as conn:
            applied = await migrate(conn)
    except BaseException:
        await pool.close()
        raise
    log.info("storage_ready", backend="postgres", dsn=redact_dsn(section.dsn or ""),
             migrations_applied=[m.version for m in applied])
    return pool
