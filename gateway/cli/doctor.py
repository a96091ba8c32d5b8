"""``tidegate doctor [--fix] [--json] [--env-file PATH]``: check an installation and say
how to fix what is wrong.

Checks (each a function below, each finding with a severity — ok | warning | error — and
the exact fix): the config (with the env file the unit uses), the env file's mode,
state-dir permissions, a stale ``gateway.json``, disk space, clock and timezones, each
provider in the agents' model chains and each of its auth profiles (one tiny request
(gateway.cli.models.probe_models)), each channel token (live), each
webhook (secret set, registered with the platform, reachable and refusing a bad
signature: gateway.cli.webhooks), tool-policy entries and skills (diagnostics), the
timeline (chains of the 20 most recent sessions verified), torn transcript lines, corrupt
JSON state files (cron jobs, auth state, subagent runs, activation, budget state), the
outbox backlog, and the systemd unit against this installation.
``--fix`` repairs only what is safe: permissions and a stale ``gateway.json``.
Exit 1 when any error is found, else 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.cli.output import print_json
from gateway.config.load import ConfigError, load_config

TIMELINE_SAMPLE = 20
DISK_WARN, DISK_ERROR = 1 << 30, 100 << 20  # bytes free


@dataclass
class Finding:
    check: str
    severity: str           # ok | warning | error
    message: str
    fix: str = ""
    fixed: bool = False


def register(sub: Any) -> None:
    d = sub.add_parser("doctor", help="check the installation and print exact fixes")
    d.add_argument("--fix", action="store_true",
                   help="repair what is safe (permissions, a stale gateway.json)")
    d.add_argument("--json", action="store_true", help="machine-readable JSON")
    d.add_argument("--env-file", metavar="PATH",
                   help="the unit's EnvironmentFile (default <state_dir>/tidegate.env)")
    d.add_argument("--unit-dir", help=argparse.SUPPRESS)
    d.set_defaults(func=cmd_doctor, raw_config=True)


# -- checks ----------------------------------------------------------------------------

def check_config(ctx: dict[str, Any]) -> list[Finding]:
    try:
        ctx["loaded"] = load_config(ctx["config_arg"], env=ctx["env"])
    except ConfigError as exc:
        try:  # the other checks still run when only a secret is missing
            ctx["loaded"] = load_config(ctx["config_arg"], env=ctx["env"], strict_env=False)
        except ConfigError:
            ctx["loaded"] = None
        return [Finding("config", "error", "; ".join(exc.problems),
                        f"edit {exc.source} (tidegate config validate --env-file "
                        f"{ctx['env_file']})")]
    where = ctx["loaded"].path or "built-in defaults"
    return [Finding("config", "ok", f"valid ({where}; env file {ctx['env_file']})")]


def check_env_file(ctx: dict[str, Any]) -> list[Finding]:
    path: Path = ctx["env_file"]
    if not path.exists():
        return [Finding("env_file", "ok", f"{path} absent (secrets come from the "
                                          f"environment)")]
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        f = Finding("env_file", "warning", f"{path} is mode {mode:o}: other users can read "
                                           f"the secrets", f"chmod 600 {path}")
        if ctx["fix"]:
            path.chmod(0o600)
            f.fixed = True
        return [f]
    return [Finding("env_file", "ok", f"{path} is 0600")]


def check_permissions(ctx: dict[str, Any]) -> list[Finding]:
    state: Path = ctx["state_dir"]
    if not state.exists():
        return [Finding("permissions", "ok", f"{state} does not exist yet (the gateway "
                                             f"creates it 0700)")]
    out = []
    for path, want in ((state, 0o700), (state / "gateway.token", 0o600)):
        if not path.exists():
            continue
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            f = Finding("permissions", "warning", f"{path} is mode {mode:o} (sessions and "
                        f"tokens are private)", f"chmod {want:o} {path}")
            if ctx["fix"]:
                path.chmod(want)
                f.fixed = True
            out.append(f)
    return out or [Finding("permissions", "ok", f"{state} and its token are private")]


def check_stale_pid(ctx: dict[str, Any]) -> list[Finding]:
    info = ctx["state_dir"] / "gateway.json"
    try:
        pid = int(json.loads(info.read_text())["pid"])
    except FileNotFoundError:
        return [Finding("lock", "ok", "no gateway running, none recorded")]
    except (OSError, ValueError, KeyError, TypeError):
        pid = 0
    from gateway.cli.client import pid_alive
    if pid and pid_alive(pid):
        return [Finding("lock", "ok", f"gateway running (pid {pid})")]
    f = Finding("lock", "warning", f"{info} names pid {pid or '?'}, which is not running "
                "(the gateway did not shut down cleanly)", f"rm {info}")
    if ctx["fix"]:
        info.unlink(missing_ok=True)
        f.fixed = True
    return [f]


def check_disk(ctx: dict[str, Any]) -> list[Finding]:
    path = ctx["state_dir"] if ctx["state_dir"].exists() else ctx["state_dir"].parent
    while not path.exists():
        path = path.parent
    free = ctx.get("disk_free", shutil.disk_usage(path).free)
    mib = free // (1 << 20)
    if free < DISK_ERROR:
        return [Finding("disk", "error", f"{mib} MiB free under {path}",
                        "free disk space: transcripts and the timeline stop growing")]
    if free < DISK_WARN:
        return [Finding("disk", "warning", f"{mib} MiB free under {path}",
                        "free disk space (logs rotate; transcripts do not)")]
    return [Finding("disk", "ok", f"{mib} MiB free")]


def check_clock(ctx: dict[str, Any]) -> list[Finding]:
    import gateway
    now = ctx.get("now", time.time())
    built = Path(gateway.__file__).stat().st_mtime
    out = []
    if now < built - 86400:
        out.append(Finding("clock", "error", "the system clock is before this "
                           "installation was made", "set the clock (timedatectl "
                           "set-ntp true)"))
    loaded = ctx.get("loaded")
    zones = sorted({loaded.config.agent(a).user_timezone for a in loaded.config.agent_ids()}
                   ) if loaded else []
    local = time.strftime("%Z")
    return out or [Finding("clock", "ok", f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; "
                                          f"local zone {local}; user zones "
                                          f"{', '.join(zones) or '-'}")]


def check_providers(ctx: dict[str, Any]) -> list[Finding]:
    loaded = ctx.get("loaded")
    if loaded is None:
        return []
    from gateway.cli.models import probe_models
    out = []
    for p in asyncio.run(probe_models(loaded, ctx["env"])):
        who = p["ref"] + ("" if p["profile"] == "default" else f" (profile {p['profile']})")
        provider = p["ref"].partition("/")[0]
        out.append(Finding("provider", "ok", f"{who} answers") if p["ok"] else Finding(
            "provider", "error", f"{who}: {p['detail']}", f"check models.providers."
            f"{provider} (api_key / auth_profiles, base_url) and the model name"))
    return out or [Finding("provider", "ok", "no provider configured (built-in echo model)")]


def check_channels(ctx: dict[str, Any]) -> list[Finding]:
    loaded = ctx.get("loaded")
    if loaded is None:
        return []
    from gateway.cli.channels import probes
    out = []
    for name, p in probes(loaded).items():
        out.append(Finding("channel", "ok" if p["ok"] else "error", f"{name}: {p['detail']}",
                           "" if p["ok"] else f"check the {name.split(':')[0]} token in the "
                           f"env file / channels.{name.split(':')[0]}"))
    return out or [Finding("channel", "ok", "no chat platform enabled")]


def check_webhooks(ctx: dict[str, Any]) -> list[Finding]:
    """Secrets, registration with the platform and reachability (gateway.cli.webhooks)."""
    loaded = ctx.get("loaded")
    if loaded is None:
        return []
    from gateway.cli.webhooks import webhook_findings
    return [Finding("webhook", sev, f"{name}: {msg}", fix)
            for name, (sev, msg, fix) in webhook_findings(loaded)]


async def _pg_timeline(loaded: Any) -> list[Finding]:
    """The PostgreSQL timeline (storage.backend postgres): the same sample verified."""
    from runtime.storage.postgres.pool import open_pool
    from runtime.timeline import Timeline
    pool = await open_pool(loaded.config.storage.model_copy(update={
        "pool": loaded.config.storage.pool.model_copy(update={"min": 1, "max": 1})}))
    try:
        tl = await Timeline.open_postgres(pool, readonly=True)
        infos = await tl.store.timelines(limit=TIMELINE_SAMPLE)
        for info in infos:
            report = await tl.verify(info.session_id)
            if not report.ok:
                return [Finding("timeline", "error", f"session {info.session_id}: "
                                f"{report.reason} at seq {report.seq}", "keep the database "
                                f"as evidence; tidegate timeline verify {info.session_id} "
                                "names the event")]
    finally:
        await pool.close()
    return [Finding("timeline", "ok", f"{len(infos)} most recent timelines verified "
                    "(PostgreSQL)")]


def check_timeline(ctx: dict[str, Any]) -> list[Finding]:
    loaded = ctx.get("loaded")
    if loaded and loaded.config.storage.backend == "postgres":
        try:
            return asyncio.run(_pg_timeline(loaded))
        except Exception as exc:  # noqa: BLE001 - unreachable, not migrated: one finding
            return [Finding("timeline", "error", f"PostgreSQL timeline: {exc}", "check "
                            "storage.dsn and `tidegate storage status`")]
    path = Path(loaded.config.timeline.path).expanduser() if loaded and \
        loaded.config.timeline.path else ctx["state_dir"] / "timeline.db"
    if not path.exists():
        return [Finding("timeline", "ok", "no timeline yet")]
    from runtime.timeline.verify import verify_rows
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            ids = [r[0] for r in conn.execute(
                "SELECT session_id FROM timelines ORDER BY created_at DESC LIMIT ?",
                (TIMELINE_SAMPLE,))]
            for sid in ids:
                report = verify_rows(conn, sid)
                if not report.ok:
                    return [Finding("timeline", "error", f"session {sid}: {report.reason} at "
                                    f"seq {report.seq}", "keep the database as evidence; "
                                    f"tidegate timeline verify {sid} names the event")]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return [Finding("timeline", "error", f"{path}: {exc}", "restore timeline.db from a "
                        "backup (the gateway reports it in status.problems)")]
    return [Finding("timeline", "ok", f"{len(ids)} most recent timelines verified")]


def check_transcripts(ctx: dict[str, Any]) -> list[Finding]:
    torn = []
    for path in sorted(ctx["state_dir"].glob("agents/*/sessions/*.jsonl")):
        with open(path, "rb") as fh:
            for no, raw in enumerate(fh, 1):
                try:
                    json.loads(raw)
                except ValueError:
                    torn.append(f"{path.name} line {no}")
                    break
    if torn:
        return [Finding("transcripts", "warning", f"torn lines (skipped when read): "
                        f"{', '.join(torn[:5])}", "none needed: readers skip them and the "
                        "next append starts on a fresh line; transcripts are never "
                        "rewritten")]
    return [Finding("transcripts", "ok", "every transcript line parses")]


# JSON state files the gateway replaces atomically, and what each holds
STATE_FILES = {"cron/jobs.json": "the cron jobs (cron stays disabled: no job fires)",
               "auth-state.json": "persisted profile cooldowns",
               "subagents/runs.json": "subagent run records",
               "channels/activation.json": "group activation settings",
               "usage/budget_state.json": "budget overrides and alerts"}


def check_state_files(ctx: dict[str, Any]) -> list[Finding]:
    out = []
    for rel, owner in STATE_FILES.items():
        path = ctx["state_dir"] / rel
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            out.append(Finding("state", "error", f"{path} is corrupt ({exc}); it holds "
                               f"{owner}", f"repair the JSON or "
                               f"move it away (mv {path} {path}.bad), then restart the "
                               f"gateway"))
    return out or [Finding("state", "ok", "every JSON state file parses")]


def _outbox_waiting(ctx: dict[str, Any]) -> tuple[int, float]:
    """(replies waiting, creation time of the oldest) from the configured store."""
    loaded = ctx.get("loaded")
    if loaded is not None and loaded.config.storage.backend == "postgres":
        from gateway.service.storage import offline_records
        from runtime.clock import parse_iso
        entries = offline_records(loaded, "outbox").peek()
        stamps = [parse_iso(e["created_at"]) for e in entries if e.get("created_at")]
        return len(entries), min(stamps, default=0.0)
    files = list((ctx["state_dir"] / "outbox").glob("*.json"))
    return len(files), min((p.stat().st_mtime for p in files), default=0.0)


def check_outbox(ctx: dict[str, Any]) -> list[Finding]:
    return [*_spill_waiting(ctx), *_outbox_backlog(ctx)]


def _spill_waiting(ctx: dict[str, Any]) -> list[Finding]:
    """Outbox writes PostgreSQL refused, waiting on local disk (channels/outbound/spill.py)."""
    from channels.outbound.spill import spill_summary
    outbox = ctx["state_dir"] / "outbox"
    try:
        waiting = spill_summary(outbox, ctx.get("now", time.time()))
    except (OSError, ValueError) as exc:
        return [Finding("outbox", "error", f"the outbox spill file is unreadable ({exc})",
                        "the gateway sets it aside as .corrupt at its next start")]
    if waiting is None:
        return []
    return [Finding("outbox", "error", f"{waiting[0]} outbox writes wait in {outbox}/"
                    f"pending-spill.jsonl, oldest {int(waiting[1])} s: PostgreSQL refused "
                    "them", "start PostgreSQL (check storage.dsn); the gateway re-submits "
                    "them once it is reachable; do not delete the file")]


def _outbox_backlog(ctx: dict[str, Any]) -> list[Finding]:
    try:
        count, oldest = _outbox_waiting(ctx)
    except Exception as exc:  # noqa: BLE001 - PostgreSQL unreachable: say so
        return [Finding("outbox", "warning", f"cannot read the outbox: {exc}",
                        "check storage.dsn and that PostgreSQL is up")]
    if count:
        age = int(ctx.get("now", time.time()) - oldest)
        return [Finding("outbox", "warning", f"{count} replies waiting, oldest "
                        f"{age // 60} min", "check `tidegate channels status --probe`; "
                        "they are sent when the platform is back")]
    return [Finding("outbox", "ok", "empty")]


def check_unit(ctx: dict[str, Any]) -> list[Finding]:
    from gateway.service.unit import UNIT_NAME
    dirs = [Path(ctx["unit_dir"])] if ctx.get("unit_dir") else [
        Path.home() / ".config/systemd/user", Path("/etc/systemd/system")]
    unit = next((d / UNIT_NAME for d in dirs if (d / UNIT_NAME).exists()), None)
    if unit is None:
        return [Finding("systemd", "ok", "no unit installed (tidegate service install)")]
    line = next((ln for ln in unit.read_text().splitlines()
                 if ln.startswith("ExecStart=")), "ExecStart=")
    exe = line[len("ExecStart="):].split(" ")[0].strip('"')
    if not exe or not os.access(exe, os.X_OK):
        return [Finding("systemd", "error", f"{unit}: ExecStart names {exe or 'nothing'}, "
                        "which is not an executable", "tidegate service install "
                        "(rewrites the unit for this installation)")]
    here = {str(Path(sys.executable).absolute()), shutil.which("tidegate") or ""}
    if exe not in here and Path(exe).resolve() not in {Path(h).resolve() for h in here if h}:
        return [Finding("systemd", "warning", f"{unit} runs {exe}, not this installation",
                        "tidegate service install (to run this one)")]
    return [Finding("systemd", "ok", f"{unit} runs this installation")]


def check_tools(ctx: dict[str, Any]) -> list[Finding]:
    """Tool-policy entries matching no tool or group, and skipped SKILL.md files (issue
    11: one diagnostic each, never a crash)."""
    loaded = ctx.get("loaded")
    if loaded is None:
        return []
    from gateway.tools.policy import diagnostics
    from gateway.tools.services import gateway_registry, skill_catalog
    from runtime.clock import SYSTEM_CLOCK

    cfg = loaded.config
    out = [Finding("tools", "warning", line, "fix or remove the entry; `tidegate tools "
                   "explain` shows the final set") for line in
           diagnostics(cfg, gateway_registry(cfg))]
    for agent in cfg.agent_ids():
        scan = skill_catalog(cfg, agent, loaded.state_dir, SYSTEM_CLOCK).scan()
        out += [Finding("tools", "warning", f"agent {agent} skill {line}", "fix the "
                        "SKILL.md (`tidegate skills check`)") for line in scan.diagnostics]
    return out or [Finding("tools", "ok", "every tool-policy entry matches; no skill skipped")]


CHECKS: list[Callable[[dict[str, Any]], list[Finding]]] = [
    check_config, check_env_file, check_permissions, check_stale_pid, check_disk,
    check_clock, check_providers, check_channels, check_webhooks, check_tools,
    check_timeline, check_transcripts, check_state_files, check_outbox, check_unit,
]


def cmd_doctor(args: argparse.Namespace, _loaded: Any) -> int:
    from gateway.service.unit import read_env_file
    try:
        base = load_config(args.config, strict_env=False)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    env_file = Path(args.env_file) if args.env_file else base.state_dir / "tidegate.env"
    env = dict(os.environ)
    if env_file.exists():
        try:
            env.update(read_env_file(env_file))
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    ctx = {"config_arg": args.config, "env": env, "env_file": env_file, "fix": args.fix,
           "state_dir": base.state_dir, "unit_dir": args.unit_dir, "loaded": base}
    from gateway.logs.pipeline import configure_logging, reset_logging
    configure_logging(state_dir=None, level="error")  # findings are the output, not logs
    try:
        findings = [f for check in CHECKS for f in check(ctx)]
    finally:
        reset_logging()
    if args.json:
        print_json([asdict(f) for f in findings])
    else:
        for f in findings:
            mark = {"ok": "ok  ", "warning": "WARN", "error": "FAIL"}[f.severity]
            tail = " (fixed)" if f.fixed else (f"\n      fix: {f.fix}" if f.fix and
                                               f.severity != "ok" else "")
            print(f"{mark} {f.check}: {f.message}{tail}")
    return 1 if any(f.severity == "error" and not f.fixed for f in findings) else 0
