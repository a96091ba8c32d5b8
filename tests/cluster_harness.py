"""Cluster test helpers: a private PostgreSQL server per test module (tests/pg_server.py's
``PgServer``; private because the outage test stops it) and ``wait``."""

from __future__ import annotations

import time

import pytest

from tests.pg_server import PgServer


def start_private_server() -> PgServer:
    server = PgServer()
    server.init()
    server.start()
    return server


def database_of(dsn: str) -> str:
    return dsn.rsplit("/", 1)[1]


@pytest.fixture(scope="module")
def pg():
    """One PostgreSQL server per test module (started, then destroyed)."""
    server = start_private_server()
    yield server
    server.destroy()


@pytest.fixture
def dsn(pg):
    """A fresh empty database on the module's server, for one test."""
    return pg.create_database()


def wait(pred, timeout: float = 30.0, what: str = "condition", every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


async def until(pred, what: str = "condition", timeout: float = 15.0,
                every: float = 0.02) -> None:
    """``wait`` for coroutines: poll ``pred()`` without blocking the event loop."""
    import asyncio
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(every)
