"""A TCP proxy in front of the test PostgreSQL server whose close reaches the client late.

``LingerProxy(upstream_port)`` listens on a free port on 127.0.0.1 and relays each
connection to ``127.0.0.1:upstream_port()`` byte for byte. When the server ends a
connection (a restart: every backend sends ``FATAL: terminating connection due to
administrator command`` and exits), the bytes it sent reach the client at once but the
client's socket is closed only ``linger`` seconds later, as a connection pooler, NAT or
loaded host does. Meanwhile the client's driver holds a connection that has read the
error yet still looks open (asyncpg: ``is_closed()`` is False and the next statement
raises ``InternalClientError``), the window a pool may hand that connection out in.
Runs its own event loop in a daemon thread; ``close()`` stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Self


class ThreadedProxy:
    """A relay on a free 127.0.0.1 port in front of ``127.0.0.1:upstream_port()``, run on
    its own event loop in a daemon thread. Subclasses relay each connection
    (``_relay(reader, writer)``); ``dsn()`` points a DSN through it, ``close()`` stops it."""

    thread_name = "pg-proxy"

    def __init__(self, upstream_port: Callable[[], int]) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name=self.thread_name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

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


class LingerProxy(ThreadedProxy):
    """``port``: where clients connect; ``linger``: seconds between the server's close and
    the client's (settable while running); ``closed_late``: connections closed so."""

    def __init__(self, upstream_port: Callable[[], int], *, linger: float = 0.0) -> None:
        super().__init__(upstream_port)
        self.linger = linger
        self.closed_late = 0

    async def _relay(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1",
                                                                 self.upstream_port())
        except OSError:  # the server is down: refused, as it would be without us
            writer.close()
            return
        client_gone = asyncio.Event()

        async def to_server() -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    up_writer.write(data)
                    await up_writer.drain()
            client_gone.set()
            up_writer.close()

        async def to_client() -> None:
            with contextlib.suppress(OSError):
                while data := await up_reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            if not client_gone.is_set() and self.linger > 0:
                self.closed_late += 1
                with contextlib.suppress(TimeoutError):  # the fault: a late FIN
                    await asyncio.wait_for(client_gone.wait(), self.linger)
            writer.close()

        await asyncio.gather(to_server(), to_client(), return_exceptions=True)
