"""``tidegate doctor [--fix] [--json] [--env-file PATH]``: check an installation and say
how to fix what is wrong.

Checks (each a function below, each finding with a severity — ok | warning | error — and
the exact fix): the config (with the env file the unit uses), the env file's mode,
state-dir permissions, a stale ``gateway.json``, disk space, clock and timezones, each
provider in the agents' model chains and each of its auth profiles (one tiny request
(gateway.cli.models.probe_models)), each installed plugin that fails to load, each
channel account (its plugin's live probe) and its access policy (an allowlist with
no senders: nobody is answered), each
webhook (secret set, registered with the platform, reachable and refusing a bad
signature: gateway.cli.webhooks), tool-policy entries and skills (diagnostics), the
timeline (chains of the 20 most recent sessions verified), torn transcript lines, corrupt
JSON state files (cron jobs, auth state, subagent runs, activation, budget state), the
outbox backlog, the last backup (failed or overdue), and the systemd unit against this
installation.
``--fix`` repairs only what is safe: permissions and a stale ``gateway.json``.
Exit 1 when any error is found, else 0. The checks of stored state (timeline,
transcripts, JSON state files, outbox) are in ``state.py``; a finding is ``finding.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gateway.cli.doctor.finding import Finding
from gateway.cli.doctor.state import (
    check_backup,
    check_outbox,
    check_state_files,
    check_timeline,
    check_transcripts,
)
from gateway.cli.output import print_json
from gateway.config.load import ConfigError, load_config

DISK_WARN, DISK_ERROR = 1 << 30, 100 << 20  # bytes free


def register(sub: Any) -> None:
    d = sub.add_parser("doctor", help="check the installation and print exact fixes",
                       epilog="Exit 1 when any check FAILs (warnings alone exit 0).")
    d.add_argument("--fix", action="store_true",
                   help="repair what is safe (permissions, a stale gateway.json)")
    d.add_argument("--json", action="store_true", help="machine-readable JSON")
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
    f = _private(ctx, "env_file", path, 0o600, ": other users can read the secrets")
    return [f or Finding("env_file", "ok", f"{path} is 0600")]


def check_permissions(ctx: dict[str, Any]) -> list[Finding]:
    state: Path = ctx["state_dir"]
    if not state.exists():
        return [Finding("permissions", "ok", f"{state} does not exist yet (the gateway "
                                             f"creates it 0700)")]
    out = []
    for path, want in ((state, 0o700), (state / "gateway.token", 0o600)):
        if not path.exists():
            continue
        f = _private(ctx, "permissions", path, want,
                     " (sessions and tokens are private)")
        if f:
            out.append(f)
    return out or [Finding("permissions", "ok", f"{state} and its token are private")]


def _private(ctx: dict[str, Any], check: str, path: Path, want: int,
             why: str) -> Finding | None:
    """A warning when others may read ``path`` (chmod ``want`` with ``--fix``), else None."""
    mode = path.stat().st_mode & 0o777
    if not mode & 0o077:
        return None
    f = Finding(check, "warning", f"{path} is mode {mode:o}{why}", f"chmod {want:o} {path}")
    if ctx["fix"]:
        path.chmod(want)
        f.fixed = True
    return f


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


def check_plugins(ctx: dict[str, Any]) -> list[Finding]:
    """Each installed plugin that cannot be used (it failed to import, targets another
    SDK, breaks the contract), with its error: an error when ``channels.<name>`` is in the
    config (that channel will not start), else a warning."""
    from channels import registry
    from runtime import plugins
    registry.channel_plugins()  # load and check every channel plugin
    for kind in ("tool", "provider"):
        plugins.loaded(kind)
    loaded = ctx.get("loaded")
    configured = set((loaded.raw.get("channels") or {}) if loaded is not None else ())
    out = []
    for kind in plugins.GROUPS:
        for info in plugins.discover(kind):
            if not info.error:
                continue
            used = kind == "channel" and info.name in configured
            out.append(Finding("plugin", "error" if used else "warning", info.error,
                               f"reinstall or remove {info.package} (`tidegate plugins "
                               f"doctor` shows the traceback)"
                               + (f"; channels.{info.name} is not started" if used else "")))
    return out or [Finding("plugin", "ok", "every installed plugin loads")]


def check_channels(ctx: dict[str, Any]) -> list[Finding]:
    loaded = ctx.get("loaded")
    if loaded is None:
        return []
    from gateway.cli.channels import probes
    out = []
    for name, p in probes(loaded).items():
        platform = name.split(":")[0]
        severity = {True: "ok", False: "error", None: "warning"}[p["ok"]]
        fix = {False: f"check the {platform} credentials in the env file / "
                      f"channels.{platform}",
               None: "start the gateway and check `tidegate status`"}.get(p["ok"], "")
        out.append(Finding("channel", severity, f"{name}: {p['detail']}", fix))
    return out or [Finding("channel", "ok", "no chat platform enabled")]


def check_access(ctx: dict[str, Any]) -> list[Finding]:
    """A warning per enabled account whose ``dm_policy: allowlist`` has an empty
    ``allow_from``: nobody gets an answer in direct messages (email's default policy is
    allowlist, so an email account without senders is the usual case)."""
    loaded = ctx.get("loaded")
    if loaded is None:
        return []
    from channels.sections import account_configs
    out = []
    for name, section in loaded.config.channels.platforms().items():
        for aid, acc in account_configs(section).items():
            if getattr(acc, "dm_policy", None) != "allowlist" or getattr(acc, "allow_from",
                                                                          None):
                continue
            key = f"channels.{name}" + ("" if aid == "default" and not section.accounts
                                        else f".accounts.{aid}")
            label = name if aid == "default" else f"{name}:{aid}"
            out.append(Finding("access", "warning",
                               f"{label}: dm_policy allowlist with an empty allow_from: "
                               "nobody gets an answer in direct messages",
                               f"add the senders to {key}.allow_from, or set {key}."
                               "dm_policy to pairing"))
    return out or [Finding("access", "ok", "no account has an allowlist without senders")]


def check_webhooks(ctx: dict[str, Any]) -> list[Finding]:
    """Secrets, registration with the platform and reachability (gateway.cli.webhooks)."""
    loaded = ctx.get("loaded")
    if loaded is None:
        return []
    from gateway.cli.webhooks import webhook_findings
    return [Finding("webhook", sev, f"{name}: {msg}", fix)
            for name, (sev, msg, fix) in webhook_findings(loaded)]


def runs_this_installation(exe: Path) -> bool:
    """Whether the unit's ExecStart executable ``exe`` (absolute) is this installation:
    the script this process was started as (``sys.argv[0]``, however it was named:
    ``.venv/bin/tidegate`` relative to the working directory, or through a symlink), the
    ``tidegate`` on ``PATH``, or any executable in this interpreter's own ``bin``
    directory (``python -m gateway.cli``; the venv's ``python`` is a symlink to the system
    interpreter, so the directory is compared, not the resolved file)."""
    candidates = [Path(sys.argv[0]) if sys.argv and sys.argv[0] else None,
                  Path(found) if (found := shutil.which("tidegate")) else None]
    same_file = {c.resolve() for c in candidates if c is not None and c.exists()}
    if exe.resolve() in same_file:
        return True
    bin_dir = Path(sys.executable).absolute().parent.resolve()
    return exe.absolute().parent.resolve() == bin_dir


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
    if not runs_this_installation(Path(exe)):
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
                        "SKILL.md or the directory (`tidegate skills check`)") for line in scan.diagnostics]
    return out or [Finding("tools", "ok", "every tool-policy entry matches; no skill skipped")]


CHECKS: list[Callable[[dict[str, Any]], list[Finding]]] = [
    check_config, check_env_file, check_permissions, check_stale_pid, check_disk,
    check_clock, check_providers, check_plugins, check_channels, check_access, check_webhooks,
    check_tools,
    check_timeline, check_transcripts, check_state_files, check_outbox, check_backup,
    check_unit,
]


def cmd_doctor(args: argparse.Namespace, _loaded: Any) -> int:
    from gateway.config.env_file import ENV_FILE_NAME, EnvFileChoice
    choice = getattr(args, "env_choice", EnvFileChoice())
    try:  # the env file the command-line rule picks (gateway.cli.main._dispatch)
        base = load_config(args.config, strict_env=False, env_file=choice)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    env_file = base.env_file.path or choice.path or base.state_dir / ENV_FILE_NAME
    env = dict(base.env)
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

__all__ = ["CHECKS", "Finding", "check_backup", "check_outbox", "check_state_files", "check_timeline",
           "check_transcripts", "cmd_doctor", "register"]
