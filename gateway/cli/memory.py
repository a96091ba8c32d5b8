"""``tidegate memory``: ``reindex`` and ``status`` of the semantic index, and ``list``,
``search`` and ``forget --user ID | --group CONVERSATION`` of a person's or a group's
memory scope (operators).

The commands work on ``<state_dir>/memory/<agent>/`` directly (the index is SQLite in
WAL mode; scope files are replaced atomically), so they run with or without the gateway;
a running gateway picks the changes up on its next search. ``forget`` records a
``MEMORY_FORGET`` event in the agent's memory timeline (gateway/memory/forget.py); while
the gateway runs it deletes through the gateway's control API (``POST /api/memory/forget``),
which owns the timeline's writer.
``--user`` takes a canonical sender id: an identity-link name or ``<channel>:<id>``
(resolved through identity links like the gateway does: a linked id names the link);
``--group`` a conversation id ``<channel>:<group id>``.

Exit codes: 0 ok, 1 nothing matched or the embeddings endpoint failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from gateway.cli.output import print_json, quiet_logs
from gateway.config.load import LoadedConfig


def register(sub: Any) -> None:
    """Add the ``memory`` command group to the CLI's subparsers (gateway/cli/main.py)."""
    p = sub.add_parser("memory", help="memory: semantic index, users' scopes")
    p.add_argument("--agent", help="agent id (default: the default agent)")
    msub = p.add_subparsers(dest="memory_cmd", required=True, metavar="ACTION")
    ri = msub.add_parser("reindex", help="embed new or changed paragraphs now")
    ri.add_argument("--json", action="store_true")
    ri.add_argument("--force", action="store_true",
                    help="embed every paragraph again (not only new, changed or damaged)")
    st = msub.add_parser("status", help="index size, model, vector backend")
    st.add_argument("--json", action="store_true")
    for name, text in (("list", "a user's entries"), ("search", "search as that user sees"),
                       ("forget", "delete a user's entries")):
        c = msub.add_parser(name, help=text)
        who = c.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", metavar="ID",
                         help="a person: identity-link name or <channel>:<id> (identity "
                         "links apply)")
        who.add_argument("--group", metavar="CONVERSATION",
                         help="a group conversation's scope: <channel>:<group id>")
        if name == "search":
            c.add_argument("query", metavar="QUERY", help="what to look for (words or a paraphrase)")
        if name == "forget":
            c.add_argument("ids", nargs="*", metavar="ENTRY",
                           help="entry ids (from list); none: --all is required")
            c.add_argument("--all", action="store_true", help="delete every entry")
        c.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_memory)


@quiet_logs(level="error")  # the commands print their own note:/error: lines
def cmd_memory(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    """Run one ``tidegate memory`` action; returns the exit code."""
    cfg = loaded.config
    agent = (args.agent or cfg.default_agent()).lower()
    if agent not in cfg.agent_ids():
        print(f"error: unknown agent {agent!r}", file=sys.stderr)
        return 2
    if getattr(args, "user", None) is not None and not args.user.strip():
        print("error: --user: give a canonical sender id", file=sys.stderr)
        return 2
    group = getattr(args, "group", None)
    if group is not None and (":" not in group or not group.partition(":")[2].strip()):
        print("error: --group: give <channel>:<group id> (e.g. telegram:-1001234)",
              file=sys.stderr)
        return 2
    if args.memory_cmd == "forget" and not args.ids and not args.all:
        print("error: give entry ids or --all", file=sys.stderr)
        return 2
    if args.memory_cmd == "forget" and args.ids and args.all:  # never guess which one
        print("error: give entry ids or --all, not both", file=sys.stderr)
        return 2
    return asyncio.run(_run(args, loaded, agent))


async def _run(args: argparse.Namespace, loaded: LoadedConfig, agent: str) -> int:
    from gateway.agents import provider_dicts
    from gateway.memory import MemoryHub
    from gateway.service.storage import offline_bridge
    from runtime.clock import SYSTEM_CLOCK
    from runtime.providers.failover.profiles import AuthProfiles
    door = offline_bridge(loaded)  # PostgreSQL storage: the vector index is there
    from gateway.config.secrets import secret_scrubber
    scrubber = secret_scrubber(loaded)
    hub = MemoryHub(loaded.config, loaded.state_dir, SYSTEM_CLOCK,
                    AuthProfiles(provider_dicts(loaded.config), clock=SYSTEM_CLOCK),
                    bridge=(lambda: door) if door is not None else None,
                    scrub=lambda text: scrubber.scrub(text, quiet=True))
    try:
        if args.memory_cmd in ("reindex", "status"):
            return await _index(args, hub, agent)
        return await _user(args, loaded, hub, agent, _scopes(args, hub))
    finally:
        await hub.close()
        if door is not None:
            door.close()


async def _index(args: argparse.Namespace, hub: Any, agent: str) -> int:
    from runtime.memory.embeddings import EmbeddingError
    search = hub.search_for(agent)
    if search.corrupt and args.memory_cmd == "reindex":
        aside = hub.set_aside(agent)
        print(f"the vector index was damaged ({search.corrupt}); moved it to {aside} "
              "and rebuilding", file=sys.stderr)
        search = hub.search_for(agent)
    if search.corrupt:
        info: dict[str, Any] = {"agent": agent, "semantic": False, "index": "corrupt",
                                "error": search.corrupt,
                                "note": "searches use BM25 only; tidegate memory reindex "
                                "moves the damaged file aside and rebuilds it"}
        _show(args, info)
        return 1
    if not search.semantic:
        info = {"agent": agent, "semantic": False,
                "paragraphs": len(await asyncio.to_thread(search.keyword.paragraphs)),
                "note": "memory.embeddings is not configured: search is BM25 + decay"}
    else:
        reindex = args.memory_cmd == "reindex"
        try:
            done = await search.sync(force=True, reembed=args.force) if reindex else {}
        except EmbeddingError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        info = {"agent": agent, "semantic": True,
                **await asyncio.to_thread(search.vectors.stats), **done,
                "requests": search.embedder.requests}
        if info.get("bad_vectors"):
            info["note"] = (f"{info['bad_vectors']} stored vector(s) are unusable (wrong "
                            "size or not finite) and skipped by searches; tidegate memory "
                            "reindex embeds them again")
            _show(args, info)
            return 1
    _show(args, info)
    return 0


def _show(args: argparse.Namespace, info: dict[str, Any]) -> None:
    if getattr(args, "json", False):
        print_json(info)
    else:
        for k, v in info.items():
            print(f"{k}: {_plain(k, v)}")


def _plain(key: str, value: Any) -> str:
    """A status value as a person reads it (``yes``/``no``, ``native``), not Python's."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "native (not set yet)" if key == "dimensions" else "-"
    return str(value)


def _scopes(args: argparse.Namespace, hub: Any) -> list[str]:
    """``[group:<channel>:<group id>]``, or a person's user scopes: ``user:<canonical
    id>`` (identity links and the platform's case rule applied, as the gateway resolves a
    sender), then those of the ids linked to them (``MemoryHub.user_scopes``)."""
    from gateway.routing import canonical_id, canonical_person
    if args.group is not None:
        ch, _, gid = args.group.strip().partition(":")
        return [f"group:{ch.strip().lower()}:{canonical_id(ch.strip().lower(), gid)}"]
    return hub.user_scopes(canonical_person(hub.links, args.user.strip()))


async def _user(args: argparse.Namespace, loaded: LoadedConfig, hub: Any, agent: str,
                scopes: list[str]) -> int:
    from gateway.memory.forget import person_entries
    if args.memory_cmd == "list":
        rows = [{"id": e.entry_id, "text": hub.scrub(e.text), "created_at": e.created_at}
                for e in await person_entries(hub, agent, scopes)]
        empty = f"no entries for {scopes[0]}"
    elif args.memory_cmd == "search":
        try:
            rows = await _search(hub, agent, scopes, args.query)
        except ValueError as exc:  # no searchable words, as the chat tool says
            print(f"error: {exc}", file=sys.stderr)
            return 2
        empty = f"nothing found for {args.query!r} in {scopes[0]} or the agent's memory"
    else:
        from gateway.cli.client import ApiError
        from runtime.timeline import TimelineBusyError
        try:
            gone = await _forget(loaded, hub, agent, scopes, None if args.all else args.ids)
        except (TimelineBusyError, ApiError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        rows = [{"id": i, "deleted": True} for i in gone]
        missed = [] if args.all else [i for i in args.ids if i not in gone]
        empty = f"no entries for {scopes[0]}" if args.all else \
            f"no entry {', '.join(missed)} in {scopes[0]} (see tidegate memory list)"
        if rows and missed:
            print(f"not found: {', '.join(missed)}", file=sys.stderr)
    if not rows:
        print(empty, file=sys.stderr)
    if args.json:
        print_json(rows)
    else:
        for r in rows:
            print(f"[{r['id']}] {r.get('text', 'deleted')}")
    return 0 if rows else 1


async def _search(hub: Any, agent: str, scopes: list[str],
                  query: str) -> list[dict[str, Any]]:
    import json
    import time

    from runtime.memory.tool import run_memory_search_tool
    out = await run_memory_search_tool(hub.search_for(agent), {"query": query, "limit": 20},
                                       now=time.time(), scopes=["agent", *scopes],
                                       decay_lambda=hub.config.memory.time_decay_lambda)
    found = json.loads(out)
    if found.get("note"):  # a fallback (endpoint down, wrong vector size, damaged index)
        search = hub.search_for(agent)
        why = f" ({search.last_error})" if getattr(search, "last_error", "") else ""
        print(f"note: {found['note']}{why}", file=sys.stderr)
    return [{"id": r.get("id", r["path"]), "text": hub.scrub(r["text"]), "score": r["score"],
             "scope": r["scope"], "parts": r["parts"]} for r in found["results"]]


async def _forget(loaded: LoadedConfig, hub: Any, agent: str, scopes: list[str],
                  ids: list[str] | None) -> list[str]:
    """Delete the entries; returns their ids. Through the running gateway when there is
    one (its control API: it owns the timeline's writer and pending log), else here with
    the timeline opened for writing. Raises TimelineBusyError when a gateway holds the
    timeline but its API does not answer."""
    from gateway.cli.client import ControlClient, GatewayUnavailable
    client = ControlClient.from_config(loaded)
    if client.base_url is not None:
        try:
            out = await asyncio.to_thread(client.request, "POST", "/api/memory/forget",
                                          {"agent": agent, "scopes": scopes, "ids": ids})
            return list(out["deleted"])
        except GatewayUnavailable:
            pass  # it stopped meanwhile (or was never ours): write here
    from gateway.memory.forget import forget_scopes
    timeline, pool = await _timeline(loaded)
    try:
        gone = await forget_scopes(hub, timeline, agent, scopes, ids, {"by": "cli"})
    finally:
        if timeline is not None:
            await timeline.close()
        if pool is not None:
            await pool.close()
    return [e.entry_id for e in gone]


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
