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
from collections.abc import Callable

from tests.pg_proxy import ThreadedProxy

_BOUND = b"2\x00\x00\x00\x04"  # BindComplete: the answer to an execution begins
_READY = b"Z\x00\x00\x00\x05"  # ReadyForQuery, then one status byte


class CutProxy(ThreadedProxy):
    thread_name = "pg-cut-proxy"

    def __init__(self, upstream_port: Callable[[], int]) -> None:
        super().__init__(upstream_port)
        self.cuts = 0
        self._sql: bytes | None = None

    def arm(self, sql: bytes) -> None:
        """Lose the answer to the next execution of a statement containing ``sql``."""
        self._sql = sql

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
