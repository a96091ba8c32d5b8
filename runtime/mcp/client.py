"""One MCP server connection (official ``mcp`` SDK ``ClientSession`` over ``stdio_client``
or ``streamablehttp_client``). A supervisor task owns the transport — the SDK's context
managers must be entered and left in one task — and reconnects with exponential backoff
(clock) when the server dies; ``stop()`` leaves them, which ends a stdio server's process.

``state``: stopped | connecting | connected | reconnecting | failed (a lazy server stays
stopped until its first call).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import structlog
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from runtime.clock import Clock
from runtime.mcp.config import McpServerConfig, McpToolSettings
from runtime.mcp.stderr import StderrPipe
from runtime.mcp.tool_list import list_tools

log = structlog.get_logger(__name__)

PING_INTERVAL = 5.0  # seconds between liveness pings while idle


class McpUnavailable(Exception):
    """The server is not connected (message says why)."""


class McpServer:
    """A configured server. ``on_tools(server)`` is called after every (re)load of its
    tool list (connect, ``notifications/tools/list_changed``)."""

    def __init__(self, name: str, config: McpServerConfig, settings: McpToolSettings, *,
                 clock: Clock, on_tools: Callable[[McpServer], None]) -> None:
        self.name, self.config, self.settings = name, config, settings
        self.clock, self.on_tools = clock, on_tools
        self.state = "stopped"
        self.last_error: str | None = None
        self.tools: list[types.Tool] = []
        self.connects = 0
        self._session: ClientSession | None = None
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self._broken = asyncio.Event()
        self.first_attempt = asyncio.Event()  # set once the first connect succeeded/failed
        self._stopping = False
        self._refresh: asyncio.Task | None = None
        self._log = log.bind(mcp_server=name)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Begin connecting in the background (idempotent)."""
        if self._task is None and not self._stopping:
            self.state = "connecting"
            self._task = asyncio.create_task(self._supervise(), name=f"mcp:{self.name}")

    async def stop(self) -> None:
        """Close the session and the transport (a stdio server process is ended)."""
        self._stopping = True
        self._broken.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                async with asyncio.timeout(10):
                    await task
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self.state = "stopped"

    async def _supervise(self) -> None:
        attempt = 0
        while not self._stopping:
            try:
                await self._connect_and_serve()
                attempt = 0
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - ExceptionGroups from anyio too
                self.last_error = _describe(exc)
            self.first_attempt.set()
            self._session = None
            self._ready.clear()
            if self._stopping:
                break
            attempt += 1
            delay = min(self.settings.backoff_max,
                        self.settings.backoff_initial * 2 ** (attempt - 1))
            self.state = "reconnecting" if self.connects else "failed"
            self._log.warning("mcp_disconnected", error=self.last_error, retry_in_s=delay,
                              attempt=attempt)
            await self.clock.sleep(delay)

    async def _connect_and_serve(self) -> None:
        errors = StderrPipe(self._log) if self.config.command else None
        if errors is not None:
            await errors.start()
        try:
            async with self._transport(errors) as streams:
                if errors is not None:
                    errors.close_writer()  # the child holds its own copy now
                await self._serve(streams)
        finally:
            if errors is not None:
                await errors.stop()

    async def _serve(self, streams: Any) -> None:
        async with ClientSession(streams[0], streams[1],
                                 message_handler=self._on_message) as session:
            async with asyncio.timeout(self.settings.connect_timeout):
                await session.initialize()
                self.tools = await list_tools(session, self._log)
            self._session = session
            self._broken.clear()
            self.connects += 1
            self.state, self.last_error = "connected", None
            self._log.info("mcp_connected", transport=self.config.transport,
                           tools=[t.name for t in self.tools], connects=self.connects)
            self._ready.set()
            self.first_attempt.set()
            self.on_tools(self)
            await self._watch(session)

    def _transport(self, errors: StderrPipe | None) -> Any:
        cfg = self.config
        if cfg.command:
            params = StdioServerParameters(command=cfg.command, args=list(cfg.args),
                                           env=dict(cfg.env) or None, cwd=cfg.cwd)
            assert errors is not None
            return stdio_client(params, errlog=errors.file)
        import warnings

        from mcp.client.streamable_http import streamablehttp_client
        with warnings.catch_warnings():  # the headers-taking form is the one we need
            warnings.simplefilter("ignore", DeprecationWarning)
            return streamablehttp_client(cfg.url or "", headers=dict(cfg.headers) or None,
                                         timeout=self.settings.connect_timeout)

    async def _watch(self, session: ClientSession) -> None:
        """Until stop or breakage: ping when idle so a dead server is noticed."""
        while not self._stopping:
            try:
                async with asyncio.timeout(PING_INTERVAL):
                    await self._broken.wait()
            except TimeoutError:
                async with asyncio.timeout(self.settings.timeout):
                    await session.send_ping()
                continue
            if not self._stopping:
                raise McpUnavailable(self.last_error or "connection lost")
            return

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ServerNotification) and isinstance(
                message.root, types.ToolListChangedNotification):
            self._refresh = asyncio.create_task(self._reload_tools())
        elif isinstance(message, Exception):
            self._log.warning("mcp_transport_error", error=_describe(message))

    async def _reload_tools(self) -> None:
        session = self._session
        if session is None:
            return
        try:
            self.tools = (await session.list_tools()).tools
        except Exception as exc:  # noqa: BLE001 - keep the old list
            self._log.warning("mcp_list_tools_failed", error=_describe(exc))
            return
        self._log.info("mcp_tools_changed", tools=[t.name for t in self.tools])
        self.on_tools(self)

    # -- calls ---------------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call ``tool`` under ``tools.mcp.timeout``; connects first for a lazy server and
        waits (up to ``connect_timeout``) while reconnecting. Raises McpUnavailable,
        TimeoutError, or the SDK's McpError."""
        self.start()
        try:
            async with asyncio.timeout(self.settings.connect_timeout):
                await self._ready.wait()
        except TimeoutError:
            raise McpUnavailable(f"MCP server {self.name!r} is not connected "
                                 f"({self.state}: {self.last_error})") from None
        session = self._session
        if session is None:
            raise McpUnavailable(f"MCP server {self.name!r} is not connected")
        try:
            return await session.call_tool(
                tool, arguments, read_timeout_seconds=timedelta(seconds=self.settings.timeout))
        except Exception as exc:
            if _connection_lost(exc):
                self.last_error = _describe(exc)
                self._ready.clear()  # later calls wait for the reconnect
                self._broken.set()  # the supervisor reconnects now
                raise McpUnavailable(f"MCP server {self.name!r} connection lost: "
                                     f"{self.last_error}") from None
            raise

    def status(self) -> dict[str, Any]:
        return {"state": self.state, "transport": self.config.transport,
                "last_error": self.last_error, "connects": self.connects,
                "tools": [t.name for t in self.tools]}


def _connection_lost(exc: BaseException) -> bool:
    import anyio

    if isinstance(exc, (anyio.ClosedResourceError, anyio.BrokenResourceError,
                        anyio.EndOfStream, ConnectionError)):
        return True
    return "connection closed" in str(exc).lower()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"[:300]
