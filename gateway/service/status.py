"""What ``status`` reports about a running gateway: the JSON of ``GET /api/status``
(``tidegate status --json``), its problems list, per-channel states, the models report
and the ``/status`` chat text (issue 2 "Operations", issue 14).
"""

from __future__ import annotations

import os
from typing import Any

from runtime.clock import format_elapsed, utc_iso
from runtime.plugins import problems as plugin_problems

Gateway = Any  # gateway.service.daemon.Gateway (not imported: the daemon imports this module)


def gateway_status(gw: Gateway) -> dict[str, Any]:
    return {
        "ok": True,
        "version": _version(),
        "pid": os.getpid(),
        "started_at": utc_iso(gw.started_at) if gw.started_at else None,
        "uptime_s": round(gw.clock.time() - gw.started_at, 1) if gw.started_at else 0,
        "ready": gw.ready,
        "state_dir": str(gw.state_dir),
        "config_path": str(gw.loaded.path) if gw.loaded.path else None,
        "agents": {a.id: {"model": a.settings.model_primary or "echo/diagnostic",
                          "workspace": str(a.workspace), "sessions": len(a.store)}
                   for a in gw.agents.values()},
        "lanes": gw.lanes.stats(),
        "channels": gw.channel_status(),
        "outbox": {"pending": gw.outbox.pending(), "unsaved": gw.outbox.unsaved(),
                   "spill": gw.outbox.spill_status(), "waiting": outbox_waiting(gw)},
        "timeline": gw.timeline_hooks.status() if gw.timeline_hooks else
        {"enabled": False},
        "scheduler": gw.scheduling.status(),
        "subagents": {"disabled": gw.subagents.service.disabled,
                      "active": sum(r.active for r in gw.subagents.service.records
                                    .values())},
        "tools": {"diagnostics": list(gw.tool_diagnostics)},
        "delivery": {"sent": gw.deliverer.sent, "failed": gw.deliverer.failed,
                     "unconfirmed": gw.deliverer.unconfirmed_total,
                     "unconfirmed_recent": list(gw.deliverer.unconfirmed)},
        "journal": gw.journal.stats(),
        "outcomes": _outcomes(gw),
        "monitoring": gw.deadman.status(),
        "mcp": gw.mcp.status(),
        "models": gw.models_status(),
        "tool_loop": {"paused_tools": gw.loop_breaker.status()},
        "usage": gw.usage.status(),
        "reload": gw.reload_report.status(),
        "backup": gw.backup.status(),
        "problems": gw.current_problems(),
        **({"cluster": gw.cluster.status()} if gw.cluster is not None else {}),
    }

def outbox_waiting(gw: Gateway) -> list[dict[str, Any]]:
    """``Outbox.waiting()`` with each group's ``channel_key`` (the key of ``channels`` in
    the status: ``telegram``, or ``telegram:<account>`` for another account) and its
    ``last_error`` redacted (it is shown outside the log)."""
    from gateway.logs.pipeline import redact
    return [{**g, "last_error": redact(g["last_error"]),
             "channel_key": g["channel"] if g["account_id"] == "default"
             else f"{g['channel']}:{g['account_id']}"} for g in gw.outbox.waiting()]


def outbox_problems(gw: Gateway) -> list[str]:
    """One line per channel account whose replies wait in the outbox past
    ``STUCK_AFTER`` or a failed retry: ``N replies waiting in the outbox for
    telegram:default (oldest 2m 5s, 3 attempts, next retry in 1m 55s); last error: …``."""
    lines = []
    for g in outbox_waiting(gw):
        if not g["stuck"]:
            continue
        n = g["count"]
        lines.append(f"{n} {'reply' if n == 1 else 'replies'} waiting in the outbox for "
                     f"{g['channel']}:{g['account_id']} (oldest "
                     f"{format_elapsed(g['oldest_age_s'])}, {g['attempts']} attempt"
                     f"{'' if g['attempts'] == 1 else 's'}, next retry in "
                     f"{format_elapsed(g['next_attempt_in_s'])}); last error: "
                     f"{g['last_error'] or 'none'}")
    return lines


def current_problems(gw: Gateway) -> list[str]:
    """A failed last reload, start-up problems, plus what fails right now (MCP servers,
    provider profiles, the tool-loop breaker, agents whose model the context window guard
    refuses, replies stuck in the outbox, plugins that cannot be used). Shown outside
    the log: every secret (the gateway token included) is ``[redacted:NAME]``."""
    from gateway.config.secrets import runtime_secrets, secret_scrubber
    scrubber = secret_scrubber(gw.loaded, runtime_secrets(gw))  # the gateway token too
    return [scrubber.scrub(p, quiet=True) for p in _problems(gw)]


def _problems(gw: Gateway) -> list[str]:
    refused = [f"agent {a.id}: {v.message} (context window guard: its turns are refused)"
               for a in gw.agents.values() if a.runner.guard is not None
               and (v := a.runner.guard.verdict(a.runner.caller.chain[0])).level == "refuse"]
    return [*gw.reload_report.problems(), *gw.problems, *gw.channel_health.problems(),
            *gw.mcp.problems(), *gw.auth_profiles.problems(),
            *gw.loop_breaker.problems(), *refused, *gw.outbox.problems(),
            *outbox_problems(gw),
            *gw.backup.problems(),
            *(gw.cluster.problems() if gw.cluster is not None else []), *_outcome_problems(gw),
            *_timeline_problems(gw), *plugin_problems()]


def _timeline_problems(gw: Gateway) -> list[str]:
    """The SQLite timeline's failing commits (runtime/timeline/writer.py ``problems``)."""
    hooks = gw.timeline_hooks
    store = getattr(hooks.timeline, "store", None) if hooks is not None else None
    problems = getattr(store, "problems", None)
    return problems() if problems is not None else []

def models_status(gw: Gateway) -> dict[str, Any]:
    """Providers and profiles (runtime/providers/failover) and, per agent, its chain,
    what it would use now and what answered last (``tidegate models status``)."""
    return gw.auth_profiles.report({a.id: a.runner.caller.chain
                                      for a in gw.agents.values()})

def channel_status(gw: Gateway) -> dict[str, Any]:
    out: dict[str, Any] = {"webchat": {"state": "connected" if
                                       gw.config.channels.webchat.enabled else "disabled"}}
    for name, section in gw.config.channels.platforms().items():
        if not getattr(section, "enabled", True):
            out[name] = {"state": "disabled"}
    for ch in gw.channels:
        key = ch.name if ch.account_id == "default" else f"{ch.name}:{ch.account_id}"
        try:
            out[key] = ch.status()
        except Exception as exc:  # noqa: BLE001
            out[key] = {"state": "failed", "last_error": str(exc)}
    from gateway.config.secrets import runtime_secrets, secret_scrubber
    scrubber = secret_scrubber(gw.loaded, runtime_secrets(gw))
    for value in out.values():  # shown outside the log, like the problems
        if isinstance(value, dict) and isinstance(value.get("last_error"), str):
            value["last_error"] = scrubber.scrub(value["last_error"], quiet=True)
    return out

def status_text(gw: Gateway, agent_id: str, session_key: str) -> str:
    agent = gw.agents.get(agent_id)
    entry = agent.store.get(session_key) if agent else None
    lines = [f"Agent: {agent_id} (model {agent.settings.model_primary or 'echo/diagnostic'})"
             if agent else f"Agent: {agent_id}",
             f"Session: {session_key}"]
    if entry is not None:
        c = entry.counters
        lines += [f"Session id: {entry.session_id}",
                  f"Started: {utc_iso(entry.created_at)}",
                  (f"Turns: {c.get('turns', 0)}, tokens in/out: "
                   f"{c.get('input_tokens', 0)}/{c.get('output_tokens', 0)}")]
    else:
        lines.append("No session yet.")
    lines.append("Channels: " + ", ".join(f"{k}={v.get('state')}" for k, v in
                                         gw.channel_status().items()))
    problems = gw.current_problems()
    if problems:
        lines.append("Problems: " + "; ".join(problems))
    return "\n".join(lines)


def _outcome_problems(gw: Gateway) -> list[str]:
    """Dead letters and messages left without an outcome (docs/outcomes.md), for the
    problems list (``status``, the control UI)."""
    out = _outcomes(gw)
    lines = [(f"{out['unresolved']} accepted message(s) have no outcome after their turn "
             "timeout (a bug: see tidegate sessions outcomes and the log)")] \
        if out["unresolved"] else []
    lines += [f"dead letter {d['id']} ({d['session_key']}): {d['detail']}; see tidegate "
              f"channels dead-letters show {d['id']}" for d in out["dead_letters_recent"]]
    return lines


def _outcomes(gw: Gateway) -> dict[str, Any]:
    from gateway.journal.recorder import outcome_status
    return outcome_status(gw)


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("tidegate")
    except Exception:  # noqa: BLE001
        return "0.0.0"
