"""``tidegate memory``: ``reindex`` and ``status`` of the semantic index, and ``list``,
``search`` and ``forget --user ID`` of a user's memory scope (operators).

The commands work on ``<state_dir>/memory/<agent>/`` directly (the index is SQLite in
WAL mode; scope files are replaced atomically), so they run with or without the gateway;
a running gateway picks the changes up on its next search. ``forget`` records a
``MEMORY_FORGET`` event in the agent's memory timeline (gateway/memory/forget.py).
``--user`` takes a canonical sender id: an identity-link name or ``<channel>:<id>``.

Exit codes: 0 ok, 1 nothing matched or the embeddings endpoint failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from gateway.cli.output import print_json
from gateway.config.load import LoadedConfig


def register(sub: Any) -> None:
    """Add the ``memory`` command group to the CLI's subparsers (gateway/cli/main.py)."""
    p = sub.add_parser("memory", help="memory: semantic index, users' scopes")
    p.add_argument("--agent", help="agent id (default: the default agent)")
    msub = p.add_subparsers(dest="memory_cmd", required=True, metavar="ACTION")
    msub.add_parser("reindex", help="embed new or changed paragraphs now").add_argument(
        "--json", action="store_true")
    st = msub.add_parser("status", help="index size, model, vector backend")
    st.add_argument("--json", action="store_true")
    for name, text in (("list", "a user's entries"), ("search", "search as that user sees"),
                       ("forget", "delete a user's entries")):
        c = msub.add_parser(name, help=text)
        c.add_argument("--user", required=True, metavar="ID",
                       help="canonical sender id (identity-link name or <channel>:<id>)")
        if name == "search":
            c.add_argument("query", metavar="QUERY", help="what to look for (words or a paraphrase)")
        if name == "forget":
            c.add_argument("ids", nargs="*", metavar="ENTRY",
                           help="entry ids (from list); none: --all is required")
            c.add_argument("--all", action="store_true", help="delete every entry")
        c.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_memory)


def cmd_memory(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    """Run one ``tidegate memory`` action; returns the exit code."""
    from gateway.logs.pipeline import configure_logging
    configure_logging(state_dir=None, level="warning")
    cfg = loaded.config
    agent = (args.agent or cfg.default_agent()).lower()
    if agent not in cfg.agent_ids():
        print(f"error: unknown agent {agent!r}", file=sys.stderr)
        return 2
    if getattr(args, "user", None) is not None and not args.user.strip():
        print("error: --user: give a canonical sender id", file=sys.stderr)
        return 2
    if args.memory_cmd == "forget" and not args.ids and not args.all:
        print("error: give entry ids or --all", file=sys.stderr)
        return 2
    return asyncio.run(_run(args, loaded, agent))


async def _run(args: argparse.Namespace, loaded: LoadedConfig, agent: str) -> int:
    from gateway.agents import provider_dicts
    from gateway.memory import MemoryHub
    from runtime.clock import SYSTEM_CLOCK
    from runtime.providers.failover.profiles import AuthProfiles
    hub = MemoryHub(loaded.config, loaded.state_dir, SYSTEM_CLOCK,
                    AuthProfiles(provider_dicts(loaded.config), clock=SYSTEM_CLOCK))
    try:
        if args.memory_cmd in ("reindex", "status"):
            return await _index(args, hub, agent)
        return await _user(args, loaded, hub, agent, f"user:{args.user.strip()}")
    finally:
        await hub.close()


async def _index(args: argparse.Namespace, hub: Any, agent: str) -> int:
    from runtime.memory.embeddings import EmbeddingError
    search = hub.search_for(agent)
    if not search.semantic:
        info = {"agent": agent, "semantic": False,
                "paragraphs": len(await asyncio.to_thread(search.keyword.paragraphs)),
                "note": "memory.embeddings is not configured: search is BM25 + decay"}
    else:
        try:
            done = await search.sync(force=args.memory_cmd == "reindex") \
                if args.memory_cmd == "reindex" else {}
        except EmbeddingError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        info = {"agent": agent, "semantic": True, **search.vectors.stats(), **done,
                "requests": search.embedder.requests}
    if getattr(args, "json", False):
        print_json(info)
    else:
        for k, v in info.items():
            print(f"{k}: {v}")
    return 0


async def _user(args: argparse.Namespace, loaded: LoadedConfig, hub: Any, agent: str,
                scope: str) -> int:
    store = hub.store_for(agent)
    if args.memory_cmd == "list":
        rows = [{"id": e.entry_id, "text": e.text, "created_at": e.created_at}
                for e in await asyncio.to_thread(store.entries, scope)]
    elif args.memory_cmd == "search":
        rows = await _search(hub, agent, scope, args.query)
    else:
        from gateway.memory.forget import forget
        timeline, pool = await _timeline(loaded)
        try:
            gone = await forget(hub, timeline, agent, scope, None if args.all else args.ids,
                                {"by": "cli"})
        finally:
            if timeline is not None:
                await timeline.close()
            if pool is not None:
                await pool.close()
        rows = [{"id": e.entry_id, "deleted": True} for e in gone]
    if args.json:
        print_json(rows)
    else:
        for r in rows:
            print(f"[{r['id']}] {r.get('text', 'deleted')}")
    return 0 if rows else 1


async def _search(hub: Any, agent: str, scope: str, query: str) -> list[dict[str, Any]]:
    import json
    import time

    from runtime.memory.tool import run_memory_search_tool
    out = await run_memory_search_tool(hub.search_for(agent), {"query": query, "limit": 20},
                                       now=time.time(), scopes=["agent", scope],
                                       decay_lambda=hub.config.memory.time_decay_lambda)
    return [{"id": r.get("id", r["path"]), "text": r["text"], "score": r["score"],
             "scope": r["scope"]} for r in json.loads(out)["results"]]


async def _timeline(loaded: LoadedConfig) -> tuple[Any, Any]:
    """The configured timeline, writable, and the pool to close (or None, None when the
    timeline is disabled)."""
    from runtime.clock import SYSTEM_CLOCK
    from runtime.timeline import Timeline
    cfg = loaded.config
    if not cfg.timeline.enabled:
        return None, None
    if cfg.storage.backend == "postgres":
        from runtime.storage.postgres.pool import open_pool
        pool = await open_pool(cfg.storage.model_copy(update={
            "pool": cfg.storage.pool.model_copy(update={"min": 1, "max": 2})}))
        return await Timeline.open_postgres(pool, SYSTEM_CLOCK), pool
    from gateway.cli.timeline import timeline_db_path
    return await Timeline.open_sqlite(timeline_db_path(loaded), SYSTEM_CLOCK), None
