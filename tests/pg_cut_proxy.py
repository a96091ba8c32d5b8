"""A TCP proxy in front of the test PostgreSQL server that loses the answer to a
committed statement: the commit hidden by a cut connection, as when the server is stopped
(``terminating connection due to administrator command``) or the network drops just after
a statement's implicit transaction committed.

``CutProxy(upstream_port)`` listens on a free port on 127.0.0.1 and relays each
connection byte for byte. ``arm(sql)``: on the next connection whose client sends a
statement containing ``sql`` (bytes of its text: asyncpg sends it in the Parse message),
the server's answer to that statement's execution (from its BindComplete on) is held
until its ReadyForQuery — the statement's implicit transaction has committed by then —
dropped, and the connection closed on both sides: the client sees the connection closed
in the middle of the operation, the server has the row. Once per ``arm``; ``cuts``
counts them. Runs its own event loop in a daemon thread; ``close()`` stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

_BOUND = b"2\x00\x00\x00\x04"  # BindComplete: the answer to an execution begins
_READY = b"Z\x00\x00\x00\x05"  # ReadyForQuery, then one status byte


class CutProxy:
    def __init__(self, upstream_port: Callable[[], int]) -> None:
        self.upstream_port = upstream_port
        self.cuts = 0
        self.port = 0
        self._sql: bytes | None = None
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="pg-cut-proxy",
                                        daemon=True)

    def start(self) -> CutProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def arm(self, sql: bytes) -> None:
        """Lose the answer to the next execution of a statement containing ``sql``."""
        self._sql = sql

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1",
                                                                 self.upstream_port())
        except OSError:
            writer.close()
            return

        marked = asyncio.Event()  # this connection sent the armed statement

        async def to_server() -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    if self._sql is not None and self._sql in data:
                        self._sql = None
                        marked.set()
                    up_writer.write(data)
                    await up_writer.drain()
            up_writer.close()

        async def to_client() -> None:
            held = b""
            with contextlib.suppress(OSError):
                while data := await up_reader.read(65536):
                    if marked.is_set() and (held or _BOUND in data):
                        held += data  # the execution's answer: wait for its commit
                        if _READY in held[held.find(_BOUND):]:
                            self.cuts += 1
                            break  # dropped: neither the answer nor the rest arrives
                        continue
                    writer.write(data)
                    await writer.drain()
            writer.close()
            up_writer.close()

        await asyncio.gather(to_server(), to_client(), return_exceptions=True)

    def dsn(self, upstream_dsn: str) -> str:
        """``upstream_dsn`` (a ``postgresql://user@127.0.0.1:<port>/db`` URL) through us."""
        head, _, tail = upstream_dsn.rpartition("@127.0.0.1:")
        return f"{head}@127.0.0.1:{self.port}/{tail.split('/', 1)[1]}"

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
