"""Errors of the PostgreSQL backend (importable without asyncpg)."""

from __future__ import annotations


class StorageStartError(Exception):
    """The gateway cannot start on its configured storage; str() says why and names the
    (redacted) DSN."""


class StorageUnavailable(StorageStartError):
    """PostgreSQL cannot be reached or refuses the login."""


class MigrationError(StorageStartError):
    """The schema cannot be brought up to date (a changed applied file, a failing file)."""
