"""Output helpers shared by every command group of the CLI."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any


def print_json(data: Any) -> None:
    """Pretty JSON on stdout (every ``--json`` output of the CLI)."""
    print(json.dumps(data, indent=2, ensure_ascii=False))


def stdout_gone() -> int:
    """Exit code 0 after the reader of stdout went away (``tidegate ... | head``), with
    nothing on stderr, like any Unix filter.

    stdout is pointed at /dev/null so the interpreter's final flush of what is still
    buffered does not raise (and print) a second BrokenPipeError on exit.
    """
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):  # no real file descriptor (tests capture stdout)
        pass
    return 0


# commands that list broken plugins in their own output (one line each there)
LISTS_PLUGINS = ("doctor", "plugins")


def plugin_failure_line(command: str | None) -> Callable[[Any], None]:
    """How a CLI command tells of a plugin that failed to load (runtime/plugins.py
    ``reported_by``): one line on stderr, ``tidegate: <error> (...)`` — no traceback,
    which ``tidegate plugins doctor`` shows; nothing for :data:`LISTS_PLUGINS`."""
    def report(info: Any) -> None:
        if command not in LISTS_PLUGINS:
            print(f"tidegate: {info.error} (the other plugins work; `tidegate plugins "
                  "doctor` shows why)", file=sys.stderr)
    return report


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 session``, ``2 sessions`` (``many`` for irregular plurals)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def human(value: Any) -> str:
    """A value as an operator reads it: ``-`` for None, ``yes``/``no``, ``k=v, k=v`` for a
    mapping, ``a, b`` for a list — never a Python repr."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k}={human(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple, set)):
        return ", ".join(human(v) for v in value) or "-"
    return str(value)


def render_status(status: dict[str, Any]) -> str:
    """The human form of ``GET /status`` (``tidegate status``)."""
    ready = "ready" if status.get("ready") else "not ready"
    lines = [(f"gateway: running (pid {status['pid']}, up {status['uptime_s']:g}s, "
              f"{ready}), version {status.get('version', '?')}"),
             f"state dir: {status.get('state_dir')}"]
    chains = (status.get("models") or {}).get("chains") or {}
    for aid, a in status.get("agents", {}).items():
        lines.append(f"agent {aid}: model {a['model']}, {plural(a['sessions'], 'session')}")
        last = (chains.get(aid) or {}).get("last_answer")
        if last:  # which model and auth profile answered (failover)
            lines.append(f"  last answer: {last['model']} (profile {last['profile']}) at "
                         f"{last['at']}")
    lanes = status.get("lanes", {})
    running = lanes.get("running") or {}
    busy = ", ".join(f"{kind} {n}/{lanes.get('caps', {}).get(kind, '?')}"
                     for kind, n in running.items()) or "none running"
    lines.append(f"lanes: {plural(lanes.get('lanes', 0), 'lane')} active ({busy}), "
                 f"{lanes.get('queued', 0)} queued")
    cluster = status.get("cluster")
    owners = {a["account"]: rid for rid, r in ((cluster or {}).get("replicas") or {}).items()
              for a in r.get("accounts", [])}
    here = (cluster or {}).get("replica")
    for name, ch in status.get("channels", {}).items():
        extra = f" — last error: {ch['last_error']}" if ch.get("last_error") else ""
        if ch.get("mailbox"):  # the email channel: where it reads and how far
            extra += f" (mailbox {ch['mailbox']}, last handled UID {ch.get('uid') or 'none'})"
        if owners.get(name) not in (None, here):
            extra += f" (runs on replica {owners[name]})"
        lines.append(f"channel {name}: {human(ch.get('state'))}{extra}")
    lines.append(f"outbox: {status.get('outbox', {}).get('pending', 0)} pending")
    if isinstance(status.get("outcomes"), dict):
        lines.append(outcomes_line(status["outcomes"]))
    unconfirmed = status.get("delivery", {}).get("unconfirmed", 0)
    if unconfirmed:
        lines.append(f"delivery: {unconfirmed} unconfirmed (sent, never answered; not resent)")
    usage = status.get("usage")
    if isinstance(usage, dict) and usage.get("today", {}).get("error"):
        lines.append(f"usage today: unknown ({usage['today']['error']})")
    elif isinstance(usage, dict) and usage.get("today"):
        t = usage["today"]
        lines.append(f"usage today: {plural(t.get('calls', 0), 'model call')}, "
                     f"{t.get('input_tokens', 0)} in / {t.get('output_tokens', 0)} out tokens, "
                     f"${t.get('cost_usd', 0):.4f}")
    if cluster:
        lines += cluster_lines(cluster)
    lines.append(backup_line(status.get("backup") or {}))
    for p in status.get("problems", []):
        lines.append(f"problem: {human(p)}")
    return "\n".join(lines)


def outcomes_line(o: dict[str, Any]) -> str:
    """``status.outcomes`` for people: each outcome's count since the start, the accepted
    messages without one (a bug when not 0) and the dead letters set aside."""
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted((o.get("counts") or {}).items()))
    return (f"outcomes: {counts or 'none yet'}; {o.get('unresolved', 0)} without an outcome; "
            f"{plural(o.get('dead_letters', 0), 'dead letter')}"
            + (" (tidegate channels dead-letters list)" if o.get("dead_letters") else ""))


def backup_line(b: dict[str, Any]) -> str:
    """``status.backup`` for people: the last backup's age and result, the schedule."""
    when = (f", next {b['next_at']}" if b.get("next_at") else "") if b.get("schedule") \
        else ", no schedule (backup.schedule)"
    if b.get("problem"):
        return f"backup: unknown (see the problem below){when}"
    if not b.get("last_at"):
        return f"backup: never made{when}"
    result = "ok" if b.get("ok") else f"FAILED ({b.get('error')})"
    return f"backup: last {b['last_at']} ({b.get('age_s', 0):g}s ago) {result}{when}"


def cluster_lines(cluster: dict[str, Any], max_lanes: int = 10) -> list[str]:
    """``status.cluster`` for people (README "Replicas"): PostgreSQL's state, then every
    replica with its heartbeat (lease) age, accounts and lanes (the first ``max_lanes``
    session keys)."""
    pg = cluster.get("postgres") or {}
    state = human(pg.get("state"))
    if pg.get("state") == "down":
        state += f" for {pg.get('down_for_s')}s ({human(pg.get('last_error'))})"
    lines = [(f"cluster: replica {cluster.get('replica')}, lease_ttl "
              f"{cluster.get('lease_ttl', 0):g}s, postgres {state}")]
    for rid, r in (cluster.get("replicas") or {}).items():
        alive = "stopped" if r.get("stopped") else ("alive" if r.get("alive") else "dead")
        me = " (this one)" if rid == cluster.get("replica") else ""
        accounts = ", ".join(f"{a['account']} (held {a['held_s']:g}s)"
                             for a in r.get("accounts", [])) or "none"
        keys = r.get("lanes", [])
        more = f", +{len(keys) - max_lanes} more" if len(keys) > max_lanes else ""
        lanes = f"{len(keys)}" + (f" ({', '.join(keys[:max_lanes])}{more})" if keys else "")
        lines.append(f"  replica {rid}{me}: {alive}, lease age {r.get('lease_age_s')}s, "
                     f"pid {r.get('pid')} on {r.get('host')}:{r.get('port')}; "
                     f"accounts: {accounts}; lanes: {lanes}")
    return lines


def quiet_logs(command: Callable[..., int] | None = None, *,
               level: str = "warning") -> Any:
    """Wrap a command that works without the daemon: log records at ``level`` and above
    only, on stderr, while it runs (stdout carries the command's output, often JSON).
    ``@quiet_logs`` or ``@quiet_logs(level="error")`` (a command that reports the
    warnings in its own output)."""
    if command is None:
        return functools.partial(quiet_logs, level=level)

    @functools.wraps(command)
    def run(*args: Any) -> int:
        from gateway.logs.pipeline import configure_logging, reset_logging

        configure_logging(state_dir=None, level=level)
        try:
            return command(*args)
        finally:
            reset_logging()

    return run


def format_duration(seconds: float) -> str:
    """``5400`` -> ``1h30m``; ``90`` -> ``1m30s``; ``0.5`` -> ``500ms``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    out, rest = "", round(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, rest = divmod(rest, size)
        if n:
            out += f"{n}{unit}"
    return out


class RedactingStream:
    """A text stream that writes through ``stream`` with the configured secrets (and the
    well-known token shapes) replaced by ``***`` (gateway/logs/redact.py): a provider's
    error body that echoes its key never reaches the terminal."""

    def __init__(self, stream: Any, secrets: list[str]) -> None:
        from gateway.logs.redact import Redactor
        self._stream = stream
        self._redactor = Redactor(set(secrets))

    def write(self, text: str) -> int:
        self._stream.write(self._redactor.redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...
        return getattr(self._stream, name)


def run_redacted(command: Callable[[], int], secrets: list[str]) -> int:
    """``command()`` with ``sys.stderr`` redacting ``secrets``: every CLI command that
    loads the config runs so, since error paths print what providers answered (stdout is
    the command's output and is left alone: a command may show a token on purpose)."""
    err = sys.stderr
    sys.stderr = RedactingStream(err, secrets)
    try:
        return command()
    finally:
        sys.stderr = err
