"""A blocking door into PostgreSQL for the stores whose interface is synchronous (the
session store's ``SessionRecords``, called from worker threads and once at start).

One daemon thread runs a private event loop with its own small asyncpg pool; ``call``
submits a coroutine to it and waits. Independent of the gateway's loop, so a blocking
caller on that loop (loading at start) cannot deadlock it. While the gateway serves,
code on its loop uses ``acall`` (awaits the bridge's loop) or a worker thread instead:
a blocking call there stops every session's turn for a round trip; each one is counted
(``loop_calls``) and logged at debug (``pg_bridge_call_on_event_loop`` with its caller).

Every wait is bounded: a pooled connection is waited for at most ``timeout`` (the connect
timeout) seconds, a statement runs at most ``COMMAND_TIMEOUT`` seconds (a connection a
network cut left half open never answers), and a call whose caller stopped waiting
(its timeout, a cancel) is cancelled on the bridge's loop too, so an abandoned statement
never keeps a pooled connection from the calls after it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import asyncpg
import structlog

from runtime.storage.postgres.errors import StorageUnavailable
from runtime.storage.postgres.pool import check_dsn, redact_dsn

T = TypeVar("T")
log = structlog.get_logger(__name__)

COMMAND_TIMEOUT = 60.0  # seconds a statement may run (the gateway's pool has the same)


class SyncBridge:
    """``SyncBridge(dsn)``; ``call(fn)`` runs ``await fn(conn)`` on a pooled connection and
    returns its result (raises what it raises; StorageUnavailable when the pool cannot be
    opened). ``close()`` stops the thread."""

    def __init__(self, dsn: str, *, max_size: int = 2, timeout: float = 10.0) -> None:
        check_dsn(dsn)
        self.dsn = dsn
        self.timeout = timeout
        # blocking calls made from a thread running an event loop (that loop stood still
        # meanwhile): fine before the gateway serves, a bug on a turn's or intake's path
        self.loop_calls = 0
        self._loop = asyncio.new_event_loop()
        self._spawned: set[concurrent.futures.Future] = set()  # spawn()ed, not yet done
        self._thread = threading.Thread(target=self._loop.run_forever, name="pg-bridge",
                                        daemon=True)
        self._thread.start()
        try:
            self._pool: asyncpg.Pool = self._submit(self._create(max_size), timeout + 5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            self._stop()
            raise StorageUnavailable(f"PostgreSQL at {redact_dsn(dsn)} is unavailable: "
                                     f"{type(exc).__name__}: {redact_dsn(str(exc))}") from None

    async def _create(self, max_size: int) -> asyncpg.Pool:
        # created on the bridge's loop: the pool binds to the loop it is created on
        return await asyncpg.create_pool(self.dsn, min_size=1, max_size=max_size,
                                         timeout=self.timeout,
                                         command_timeout=COMMAND_TIMEOUT)

    def _submit(self, coro: Awaitable[T], timeout: float) -> T:
        if asyncio._get_running_loop() is not None:  # an event loop waits for the database
            self.loop_calls += 1
            caller = sys._getframe(2)
            log.debug("pg_bridge_call_on_event_loop", caller=f"{caller.f_code.co_filename}:"
                      f"{caller.f_lineno}", calls=self.loop_calls)
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()  # given up on: abandoned on the bridge's loop too
            raise

    async def _run(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        for attempt in (1, 2):
            async with self._pool.acquire(timeout=self.timeout) as conn:
                try:
                    return await fn(conn)
                except asyncpg.InternalClientError:
                    # "cannot switch to state ...": a connection a server restart ended
                    # while asyncpg still thought it busy. It is raised before anything
                    # is sent, so the call is safe to make once more on a fresh one.
                    conn.terminate()
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def call(self, fn: Callable[[asyncpg.Connection], Awaitable[T]],
             timeout: float = 60.0) -> T:
        """Raises what ``fn`` raises; TimeoutError after ``timeout`` s (the statement is
        cancelled) or when no pooled connection frees up within the connect timeout."""
        return self._submit(self._run(fn), timeout)

    async def acall(self, fn: Callable[[asyncpg.Connection], Awaitable[T]],
                    timeout: float = 60.0) -> T:
        """``call`` for a coroutine on another event loop (the gateway's): awaits the
        bridge's loop without blocking the caller's, so a slow statement stalls nothing
        else. Raises what ``fn`` raises, TimeoutError after ``timeout`` s. A cancel of the
        caller always propagates (``asyncio.timeout``: Python 3.11's ``wait_for`` returns
        a result that arrives together with the cancel and drops the cancel)."""
        fut = asyncio.run_coroutine_threadsafe(self._run(fn), self._loop)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.wrap_future(fut)
        except BaseException:
            fut.cancel()  # the statement is abandoned on the bridge's loop too
            raise

    @contextlib.contextmanager
    def hold(self, timeout: float = 30.0) -> Iterator[Callable[[Callable[[asyncpg.Connection],
                                                                Awaitable[T]]], T]]:
        """One pooled connection for several calls (a transaction across them):
        yields ``run(fn)``, which awaits ``fn(conn)`` on it and returns the result."""
        async def acquire() -> asyncpg.Connection:
            return await self._pool.acquire(timeout=self.timeout)
        conn = self._submit(acquire(), self.timeout + 5)
        try:
            yield lambda fn: self._submit(fn(conn), timeout)
        finally:
            with contextlib.suppress(Exception):  # a broken connection: the pool drops it
                self._submit(self._pool.release(conn), 10)

    def spawn(self, fn: Callable[[Callable[..., Awaitable[T]]], Awaitable[None]]
              ) -> concurrent.futures.Future:
        """Run ``await fn(run)`` on the bridge's loop without waiting for it; ``run(g)``
        awaits ``g(conn)`` on a pooled connection. Returns the concurrent future."""
        fut = asyncio.run_coroutine_threadsafe(fn(self._run), self._loop)  # type: ignore[arg-type]
        self._spawned.add(fut)
        fut.add_done_callback(self._spawned.discard)
        return fut

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def close(self) -> None:
        """Let spawned writes finish (up to 5 s), close the pool, stop the thread."""
        concurrent.futures.wait(list(self._spawned), timeout=5.0)
        with contextlib.suppress(Exception):  # closing: the server may be gone already
            self._submit(self._pool.close(), 10)
        self._stop()


