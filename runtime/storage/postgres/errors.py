"""Errors of the PostgreSQL backend (importable without asyncpg)."""

from __future__ import annotations


class StorageStartError(Exception):
    """The gateway cannot start on its configured storage; str() says why and names the
    (redacted) DSN."""


class StorageUnavailable(StorageStartError):
    """PostgreSQL cannot be reached or refuses the login. ``transient``: the server was
    not reached or is not accepting connections yet (refused, timed out, starting up,
    too many connections), so trying again later may succeed; False for a refused
    login, a missing database or a bad DSN."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class StartAborted(StorageStartError):
    """The gateway was told to stop (SIGTERM) while it waited for PostgreSQL."""


class MigrationError(StorageStartError):
    """The schema cannot be brought up to date (a changed applied file, a failing file)."""
