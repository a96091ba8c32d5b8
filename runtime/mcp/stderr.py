"""A stdio MCP server's stderr as log records.

Without this the server process inherits the gateway's stderr and its output is glued onto
the gateway's own structured log lines. Each connect gets a fresh pipe: its write end is the
child's stderr (``stdio_client(errlog=...)``), its read end is read on the event loop, one
``mcp_stderr`` record (``mcp_server``, ``line``) per line, cut at ``MAX_LINE`` characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, TextIO

MAX_LINE = 2000  # characters kept of one stderr line


class StderrPipe:
    """``file``: the text file to pass as the child's stderr. ``start()`` begins reading;
    ``close_writer()`` after the child is spawned (the parent's copy would keep the pipe
    open forever); ``stop()`` ends reading (what is buffered is logged first)."""

    def __init__(self, log: Any) -> None:
        self._log = log
        read_fd, write_fd = os.pipe()
        self.file: TextIO = os.fdopen(write_fd, "w")
        self._read = os.fdopen(read_fd, "rb")
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), self._read)
        self._task = asyncio.create_task(self._pump(reader), name="mcp-stderr")

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                raw = await reader.readline()
            except ValueError:  # a line over the reader's limit: take what is there
                raw = await reader.read(1 << 20)
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line.strip():
                self._log.info("mcp_stderr", line=line[:MAX_LINE])

    def close_writer(self) -> None:
        if not self.file.closed:
            self.file.close()

    async def stop(self) -> None:
        self.close_writer()
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._task), 1.0)
            self._task.cancel()
        with contextlib.suppress(OSError):
            self._read.close()
