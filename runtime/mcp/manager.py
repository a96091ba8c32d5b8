"""The MCP manager: every configured server, its tools registered in the tool registry as
``mcp__<server>__<tool>`` (group ``plugin:mcp:<server>``), start/stop with the gateway, and
the status shown by ``tidegate mcp list`` and ``tidegate status``.

A ``lazy`` server connects on its first call; its tools come from the list cached at its
last connection (``<state_dir>/mcp/<server>.tools.json``), and with no cache yet it
connects at start like the others so its tools can be offered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from runtime.clock import Clock
from runtime.fsutil import atomic_write
from runtime.mcp.config import McpSection, McpServerConfig, McpToolSettings
from runtime.mcp.names import group_of, normalise_schema, schema_problem, unique_tool_name
from runtime.mcp.untrusted import neutral_schema, tool_description, wrap_result
from runtime.tools.registry import Tool, ToolContext, ToolError, ToolRegistry

if TYPE_CHECKING:
    from mcp import types

    from runtime.mcp.client import McpServer

log = structlog.get_logger(__name__)


class McpManager:
    """``on_change()`` is called whenever a server's tool list changed (the gateway then
    rebuilds the agents' tool lists and stable prompt prefixes — only then)."""

    def __init__(self, section: McpSection, settings: McpToolSettings, *,
                 registry: ToolRegistry, clock: Clock, state_dir: Path,
                 on_change: Callable[[], None] | None = None) -> None:
        self.registry = registry
        self.settings = settings
        self.cache_dir = state_dir / "mcp"
        self.on_change = on_change
        self.clock = clock
        self.servers: dict[str, McpServer] = {
            name: self._new_server(name, cfg) for name, cfg in _enabled(section).items()}
        self._registered: dict[str, list[str]] = {}
        self._signatures: dict[str, str] = {}

    def _new_server(self, name: str, cfg: McpServerConfig) -> McpServer:
        # the SDK takes seconds to import: only when a server is configured
        from runtime.mcp.client import McpServer

        return McpServer(name, cfg, self.settings, clock=self.clock,
                         on_tools=self._tools_loaded)

    def start(self, names: list[str] | None = None) -> None:
        """Start eager servers (and lazy ones without a cached tool list); ``names``
        limits it to those servers."""
        registered = False
        for name, server in self.servers.items():
            if names is not None and name not in names:
                continue
            cached = self._cached_tools(name) if server.config.start == "lazy" else None
            if cached is not None:
                server.tools = cached
                self._register(server)
                registered = True
            else:
                server.start()
        if registered and self.on_change is not None:
            self.on_change()

    async def reconfigure(self, section: McpSection,
                          settings: McpToolSettings) -> dict[str, list[str]]:
        """Apply a reloaded config: removed (or disabled) servers are stopped and their
        tools unregistered, added ones started, changed ones (their entry, or
        ``tools.mcp`` for all) restarted; unchanged servers keep their connection.
        Returns ``{"added", "removed", "restarted"}`` server names."""
        wanted = _enabled(section)
        all_changed = settings != self.settings
        self.settings = settings
        removed = [n for n in self.servers if n not in wanted]
        restarted = [n for n, s in self.servers.items()
                     if n in wanted and (all_changed or s.config != wanted[n])]
        added = [n for n in wanted if n not in self.servers]
        for name in removed + restarted:
            await self.servers.pop(name).stop()
            for tool in self._registered.pop(name, []):
                self.registry.unregister(tool)
            self._signatures.pop(name, None)
        for name in restarted + added:
            self.servers[name] = self._new_server(name, wanted[name])
        self.start(restarted + added)
        out = {"added": added, "removed": removed, "restarted": restarted}
        if removed or restarted or added:
            log.info("mcp_reconfigured", **out)
            if (removed or restarted) and self.on_change is not None:
                self.on_change()  # their tools are gone until the new connection lists them
        return out

    async def wait_started(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every started server's first connection
        attempt is over, so the first turns see their tools."""
        waits = [s.first_attempt.wait() for s in self.servers.values() if s.state != "stopped"]
        if waits:
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.gather(*waits)
            except TimeoutError:
                log.warning("mcp_start_slow", waited_s=timeout)

    async def stop(self) -> None:
        for server in self.servers.values():
            await server.stop()

    def _tools_loaded(self, server: McpServer) -> None:
        sig = json.dumps([t.model_dump(mode="json") for t in server.tools], sort_keys=True)
        if self._signatures.get(server.name) == sig:
            return  # a reconnect with the same tools: nothing to rebuild
        self._save_cache(server.name, sig)
        self._register(server)
        if self.on_change is not None:
            self.on_change()

    def _register(self, server: McpServer) -> None:
        for name in self._registered.pop(server.name, []):
            self.registry.unregister(name)
        names: list[str] = []
        taken = {n for s, ns in self._registered.items() if s != server.name for n in ns}
        for t in server.tools:
            name = unique_tool_name(server.name, t.name, taken | set(names))
            problem = schema_problem(t.inputSchema)
            if problem:  # one diagnostic per tool list, the tool repaired
                log.warning("mcp_tool_schema_repaired", server=server.name, tool=t.name,
                            problem=problem, fix="the server should send an object schema")
            tool = _as_tool(server, t, name, self.settings.max_result_chars)
            self.registry.register(tool)
            names.append(tool.name)
        self._registered[server.name] = names
        self._signatures[server.name] = json.dumps(
            [t.model_dump(mode="json") for t in server.tools], sort_keys=True)

    def _cached_tools(self, name: str) -> list[types.Tool] | None:
        from mcp import types

        try:
            raw = json.loads((self.cache_dir / f"{name}.tools.json").read_text("utf-8"))
            return [types.Tool.model_validate(t) for t in raw]
        except (OSError, ValueError):
            return None

    def _save_cache(self, name: str, sig: str) -> None:
        try:
            atomic_write(self.cache_dir / f"{name}.tools.json", sig.encode(), durable=False)
        except OSError as exc:
            log.warning("mcp_tool_cache_write_failed", mcp_server=name, error=str(exc))

    def status(self) -> dict[str, Any]:
        """``{server: {state, transport, last_error, connects, tools: [exposed names]}}``."""
        out = {}
        for name, server in self.servers.items():
            st = server.status()
            st["tools"] = list(self._registered.get(name, []))
            out[name] = st
        return out

    def problems(self) -> list[str]:
        """A line per server that is failed or reconnecting (for ``tidegate status``)."""
        return [f"mcp server {name}: {s.state} ({s.last_error})"
                for name, s in self.servers.items()
                if s.state in ("failed", "reconnecting")]


def _enabled(section: McpSection) -> dict[str, McpServerConfig]:
    return {n: c for n, c in section.servers.items() if c.enabled}


def _as_tool(server: McpServer, t: types.Tool, name: str, max_chars: int) -> Tool:
    from runtime.mcp.client import McpUnavailable
    from runtime.mcp.convert import result_text

    remote = t.name

    async def handler(args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            result = await server.call(remote, args)
        except McpUnavailable as exc:
            raise ToolError(str(exc)) from None
        except TimeoutError:
            raise ToolError(f"MCP tool {remote!r} timed out after "
                            f"{server.settings.timeout:g}s") from None
        text = wrap_result(server.name, remote, await asyncio.to_thread(
            result_text, result, max_chars, ctx.workspace))
        if result.isError:
            raise ToolError(text)
        return text

    # description and schema texts are the server's words: quoted, never instructions
    return Tool(name,
                tool_description(server.name, remote, t.description, t.title),
                neutral_schema(normalise_schema(t.inputSchema)), handler,
                group=group_of(server.name))
