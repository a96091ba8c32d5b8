"""The ``storage`` config section (issue 15): which backend holds the gateway's state.

``backend: embedded`` (default, zero config): files and SQLite under ``gateway.state_dir``.
``backend: postgres``: every store in one PostgreSQL database named by ``dsn`` (a
``postgresql://`` URL, usually ``${TIDEGATE_PG_DSN}``; asyncpg reads no libpq key=value
strings, so one is a config error naming ``storage.dsn``), reached through an asyncpg pool
of ``pool.min`` .. ``pool.max`` connections per gateway process.
"""


from typing import Literal, Self

from pydantic import Field, model_validator

from runtime.config_types import ConfigModel, Duration, section


class PoolSettings(ConfigModel):
    min: int = Field(2, ge=0, le=1000,
        description="connections kept open per gateway process.")
    max: int = Field(10, ge=1, le=1000,
        description="connections at most, per gateway process.")
    connect_timeout: Duration = Field(
        10.0,
        description=("each connect attempt gives up after this long; at start the gateway "
                     "retries (growing delay, up to 15 s) until PostgreSQL answers"))

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min: {self.min} must not exceed max ({self.max})")
        return self


class StorageSection(ConfigModel):
    backend: Literal["embedded", "postgres"] = Field(
        "embedded",
        description="embedded (files and SQLite under gateway.state_dir) | postgres (one PostgreSQL database).")
    dsn: str | None = Field(
        None,
        description=("postgres: a postgresql:// URL (not key=value), e.g. \"${TIDEGATE_PG_DSN}\" "
                     "(postgresql://user:pass@host:5432/tidegate)"))
    pool: PoolSettings = Field(
        section(),
        description="The PostgreSQL connection pool of each gateway process.")

    @model_validator(mode="after")
    def _dsn_needed(self) -> Self:
        if self.backend == "postgres" and not (self.dsn or "").strip():
            raise ValueError("dsn: required when backend is postgres "
                             "(e.g. dsn: ${TIDEGATE_PG_DSN})")
        dsn = (self.dsn or "").strip()
        # "${VAR}" left by a CLI run without the service's env: that command names the
        # unset variable itself (gateway/cli/storage.py)
        if dsn and "${" not in dsn and not dsn.startswith(("postgresql://", "postgres://")):
            # never echo the value: a key=value string carries its password in the clear
            raise ValueError("dsn: expected a postgresql://user:password@host:port/db URL "
                             "(libpq keyword/value strings are not supported)")
        return self
