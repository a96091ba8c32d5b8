"""One line, not a traceback, for a library's "cannot reach the server" records.

During a PostgreSQL outage asyncpg's pool logs ``Failed to restore the pool connection
floor; retrying`` with a full traceback on every reconnect attempt (asyncpg/pool.py
``_maintain_min_size``), next to our own one-line ``<what>_database_unreachable``
warnings (runtime/storage/postgres/retry.py). A traceback for "connection refused" tells
an operator nothing the line does not, and buries the lines that matter. This filter keeps
the record (level, logger, message) and folds the error into the message instead.

Other exceptions, and every exception of other loggers, keep their traceback.
"""

from __future__ import annotations

import logging

# Loggers whose connection-failure tracebacks are folded into one line.
QUIET_LOGGERS = ("asyncpg",)
# Matched on the exception's class and bases by name: asyncpg is never imported for this
# (most gateways run without PostgreSQL, and importing it costs start time, issue 9).
_OUTAGE_CLASSES = frozenset({
    "OSError", "TimeoutError", "PostgresConnectionError", "ConnectionDoesNotExistError",
    "CannotConnectNowError", "AdminShutdownError",
})


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` only says the server could not be reached (refused, reset, timed
    out, shutting down), by its class or any base class."""
    return any(cls.__name__ in _OUTAGE_CLASSES for cls in type(exc).__mro__)


class OutageTracebacks(logging.Filter):
    """A handler filter that drops the traceback of an outage record of
    :data:`QUIET_LOGGERS` or their children (see module). Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and _quiet(record.name) and is_outage(exc):
            record.msg = f"{record.getMessage()} ({type(exc).__name__}: {exc})"
            record.args = None
            record.exc_info = record.exc_text = None
        return True


def _quiet(name: str) -> bool:
    return any(name == q or name.startswith(q + ".") for q in QUIET_LOGGERS)
