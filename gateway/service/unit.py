"""The systemd unit: rendering ``tidegate.service`` and installing it with its env file
(systemd.service(5), systemd.exec(5)). DESIGN.md "Operations"; the notify protocol and
watchdog: gateway/service/notify.py.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TextIO

import structlog

from gateway.config.env_file import read_env_file  # noqa: F401 - the parser lives with the rule
from runtime.fsutil import atomic_write

log = structlog.get_logger(__name__)

UNIT_NAME = "tidegate.service"
DEFAULT_WATCHDOG_SEC = 60
# A bit above the default shutdown grace (45 s) so systemd's SIGKILL never cuts a drain short.
DEFAULT_STOP_TIMEOUT_SEC = 60
ENV_PLACEHOLDERS = (
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "TELEGRAM_BOT_TOKEN", "SLACK_BOT_TOKEN",
    "SLACK_APP_TOKEN", "DISCORD_BOT_TOKEN", "TIDEGATE_AUTH_TOKEN",
)


def render_unit(*, exec_start: str, state_dir: Path, config_path: Path | None,
                env_file: Path | None, user_mode: bool, user: str | None = None,
                group: str | None = None, watchdog_sec: int = DEFAULT_WATCHDOG_SEC,
                stop_timeout_sec: int = DEFAULT_STOP_TIMEOUT_SEC,
                sandbox: bool = False, writable: tuple[Path, ...] = ()) -> str:
    """The text of ``tidegate.service`` (systemd.service(5), systemd.exec(5)).

    ``exec_start``: the full command line (see :func:`default_exec_start`); paths should be
    absolute. ``user_mode``: a ``systemctl --user`` unit (WantedBy=default.target, no
    ``User=``, only the seccomp-based hardening a user manager can apply) versus a system
    unit (multi-user.target, ``User=user`` and ``Group=group`` (default: the user's name)
    when given, full sandboxing). ``watchdog_sec`` 0 disables the watchdog. ``sandbox``:
    an agent's exec sandbox uses bwrap, so the syscall filter also allows ``@mount``.
    ``writable``: directories outside the state dir the gateway writes too (``backup.dir``,
    a ``timeline.path`` elsewhere): added to ``ReadWritePaths=`` with ``-`` (a missing
    one does not stop the start). Relative paths are made absolute. Raises ValueError for
    values that cannot be written into a unit file (newlines; whitespace, quotes or
    backslashes in paths).
    """
    state_dir = _abs(state_dir, "state_dir")
    extra = [w for w in (_abs(w, "writable") for w in writable)
             if w != state_dir and state_dir not in w.parents]
    return "\n".join([
        "# tidegate gateway (systemd/README.md in the tidegate sources explains each part).",
        "[Unit]",
        "Description=tidegate AI agent gateway",
        *_network_lines(user_mode),
        "# A crash loop stops after 5 starts in 5 minutes (systemctl reset-failed to retry).",
        "StartLimitIntervalSec=300",
        "StartLimitBurst=5",
        "",
        "[Service]",
        *_process_lines(exec_start, watchdog_sec, stop_timeout_sec),
        *_environment_lines(state_dir, config_path, env_file, user_mode, user, group),
        *_hardening_lines(state_dir, user_mode, extra),
        *(_SANDBOX_LINES if sandbox else []),
        "",
        "[Install]",
        f"WantedBy={'default.target' if user_mode else 'multi-user.target'}",
        "",
    ])


def _process_lines(exec_start: str, watchdog_sec: int, stop_timeout_sec: int) -> list[str]:
    """How systemd starts, watches, restarts and stops the gateway."""
    return [
        "# READY=1 / STOPPING=1 / WATCHDOG=1 arrive on $NOTIFY_SOCKET from the main process.",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={_one_line(exec_start, 'exec_start')}",
        "# SIGHUP reloads config.yaml (and the secrets it references) without a restart.",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "RestartSec=5",
        "# Exit 2 = invalid config or usage: restarting cannot fix it.",
        "RestartPreventExitStatus=2",
        f"WatchdogSec={int(watchdog_sec)}",
        "# SIGTERM starts the drain (gateway.shutdown_grace); SIGKILL only after this.",
        "KillSignal=SIGTERM",
        "# mixed: SIGTERM to the gateway only, so exec-tool children finish inside the drain.",
        "KillMode=mixed",
        f"TimeoutStopSec={int(stop_timeout_sec)}",
    ]


def _environment_lines(state_dir: Path, config_path: Path | None, env_file: Path | None,
                       user_mode: bool, user: str | None, group: str | None) -> list[str]:
    """The user, working directory, env file and environment the gateway runs with."""
    lines = []
    if not user_mode and user:
        lines += [f"User={_account(user, 'user')}",
                  f"Group={_account(group or user, 'group')}"]
    lines.append(f"WorkingDirectory={_path(state_dir)}")
    if env_file is not None:
        lines += ["# Secrets (API keys, bot tokens) live here, mode 0600; '-' = optional.",
                  f"EnvironmentFile=-{_path(_abs(env_file, 'env_file'))}"]
    lines.append(_env("TIDEGATE_STATE_DIR", state_dir))
    if config_path is not None:
        lines.append(_env("TIDEGATE_CONFIG", _abs(config_path, "config_path")))
    return [*lines, "Environment=PYTHONUNBUFFERED=1", "UMask=0077"]


HOME_ROOTS = (Path("/home"), Path("/root"), Path("/run/user"))  # what ProtectHome= covers

# Seccomp-based: a user manager applies these too (they imply NoNewPrivileges=yes).
_SECCOMP_LINES = [
    "NoNewPrivileges=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "RestrictRealtime=yes",
    "# Sockets: local (AF_UNIX), IPv4/IPv6, and netlink (interface and address lookups).",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "SystemCallArchitectures=native",
    "# Syscalls a network service needs; anything else fails with EPERM, not SIGSYS.",
    "SystemCallFilter=@system-service",
    "SystemCallErrorNumber=EPERM",
]


# bwrap builds the exec sandbox's mount namespace (mount, pivot_root, umount2): not in
# @system-service. Namespaces themselves (clone, unshare) are in its @process part.
_SANDBOX_LINES = [
    "# The exec sandbox (bwrap) sets up its own mount namespace: allow the mount calls.",
    "SystemCallFilter=@mount",
]


def under_home(path: Path) -> bool:
    """True when ``path`` is inside /home, /root or /run/user (what ProtectHome= hides)."""
    return any(path == root or root in path.parents for root in HOME_ROOTS)


def _hardening_lines(state_dir: Path, user_mode: bool, extra: list[Path]) -> list[str]:
    """Sandboxing (systemd.exec(5)): seccomp filters in both kinds of unit; mount
    namespaces and capability dropping only in a system unit."""
    lines = ["", "# Hardening (systemd.exec(5)); `systemd-analyze security tidegate` rates it.",
             *_SECCOMP_LINES]
    if user_mode:
        lines += [
            "# ProtectSystem/ProtectHome/PrivateTmp/PrivateDevices/ProtectKernel*/ReadWritePaths",
            "# need mount namespaces, which a user manager only gets through unprivileged user",
            "# namespaces (off on some distributions): the unit would fail to start there, and",
            "# a user manager has no capabilities to drop (CapabilityBoundingSet=).",
        ]
    else:
        home = any(under_home(p) for p in (state_dir, *extra))
        lines += [
            "# The whole file system is read-only except the state dir"
            + (" and backup.dir / timeline.path (`-`: may be missing)." if extra else "."),
            "ProtectSystem=strict",
            " ".join([f"ReadWritePaths={_path(state_dir)}", *(f"-{_path(p)}" for p in extra)]),
            *(["# The state dir is under a home directory: homes are read-only (not hidden),",
               "# so the writable state dir inside one stays reachable.",
               "ProtectHome=read-only"] if home else
              ["# Homes (/home, /root, /run/user) are hidden: the state dir is not in one.",
               "ProtectHome=yes"]),
            "PrivateTmp=yes",
            "PrivateDevices=yes",
            "ProtectKernelTunables=yes",
            "ProtectKernelModules=yes",
            "ProtectKernelLogs=yes",
            "ProtectControlGroups=yes",
            "ProtectClock=yes",
            "ProtectHostname=yes",
            "# No capabilities at all (it binds no port below 1024 and changes no owner).",
            "CapabilityBoundingSet=",
            "AmbientCapabilities=",
        ]
    return [*lines,
            "# No MemoryDenyWriteExecute=: under it cffi's ffi.callback() fails with",
            "# \"Cannot allocate write+execute memory\" (checked with the kernel's same rule,",
            "# PR_SET_MDWE), so a dependency or plugin using it would crash mid-run."]


def _network_lines(user_mode: bool) -> list[str]:
    # network-online.target exists only in the system manager; a user manager never
    # reaches it (systemd.special(7)), so the user unit does not name it.
    if user_mode:
        return []
    return ["Wants=network-online.target", "After=network-online.target"]


def default_exec_start(config_path: Path | None = None) -> str:
    """``<tidegate> gateway [--config <path>]`` with the absolute path of the installed
    console script: ``sys.argv[0]`` when it is the ``tidegate`` script, else
    ``shutil.which("tidegate")``, else ``<sys.executable> -m gateway.cli``."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "tidegate" and argv0.exists():
        cmd = [str(argv0.resolve())]
    elif (found := shutil.which("tidegate")) is not None:
        cmd = [str(Path(found).resolve())]
    else:
        cmd = [str(Path(sys.executable).absolute()), "-m", "gateway.cli"]
    cmd.append("gateway")
    if config_path is not None:
        cmd += ["--config", str(_abs(config_path, "config_path"))]
    return " ".join(_quote(c) for c in cmd)


def install_service(*, user_mode: bool, exec_start: str | None = None, state_dir: Path,
                    config_path: Path | None, env_file: Path | None,
                    dest_dir: Path | None = None, out: TextIO | None = None,
                    user: str | None = None, group: str | None = None,
                    watchdog_sec: int = DEFAULT_WATCHDOG_SEC,
                    stop_timeout_sec: int = DEFAULT_STOP_TIMEOUT_SEC,
                    sandbox: bool = False, writable: tuple[Path, ...] = ()) -> Path:
    """Write ``tidegate.service`` and print how to enable it. Returns the unit's path.

    ``dest_dir`` defaults to ``~/.config/systemd/user`` (user mode) or
    ``/etc/systemd/system``. The unit is written atomically (temp + fsync + rename, mode
    0644). ``state_dir`` is created (0700) if missing. ``env_file``, when given and missing,
    is created with mode 0600 holding commented placeholders (an existing one is never
    touched; a group/world-readable one earns a warning). ``exec_start`` defaults to
    :func:`default_exec_start`; ``writable`` as for :func:`render_unit`. Raises OSError
    when a file cannot be written (e.g. a system install without root) and ValueError as
    :func:`render_unit`.
    """
    out = sys.stdout if out is None else out
    state_dir = _abs(state_dir, "state_dir")
    if exec_start is None:
        exec_start = default_exec_start(config_path)
    text = render_unit(exec_start=exec_start, state_dir=state_dir, config_path=config_path,
                       env_file=env_file, user_mode=user_mode, user=user, group=group,
                       watchdog_sec=watchdog_sec, stop_timeout_sec=stop_timeout_sec,
                       sandbox=sandbox, writable=writable)
    if dest_dir is None:
        dest_dir = (Path.home() / ".config/systemd/user") if user_mode \
            else Path("/etc/systemd/system")
    dest_dir.mkdir(parents=True, exist_ok=True)
    unit_path = dest_dir / UNIT_NAME
    atomic_write(unit_path, text.encode(), mode=0o644)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if env_file is not None:
        _ensure_env_file(_abs(env_file, "env_file"), out)
    _print_next_steps(out, unit_path, user_mode, env_file, state_dir, user)
    log.info("service_unit_written", path=str(unit_path), user_mode=user_mode)
    return unit_path


def _ensure_env_file(path: Path, out: TextIO) -> None:
    if path.exists():
        if path.stat().st_mode & 0o077:
            out.write(f"warning: {path} is readable by other users; "
                      f"run: chmod 600 {shlex.quote(str(path))}\n")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    body = ["# tidegate secrets, read by systemd (EnvironmentFile=). Keep this file 0600.",
            "# Reference them from config.yaml as ${NAME}; one NAME=value per line.", ""]
    body += [f"# {name}=..." for name in ENV_PLACEHOLDERS]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("\n".join(body) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    out.write(f"created {path} (mode 0600): put your API keys and bot tokens there\n")


def _print_next_steps(out: TextIO, unit_path: Path, user_mode: bool, env_file: Path | None,
                      state_dir: Path, user: str | None) -> None:
    ctl = "systemctl --user" if user_mode else "systemctl"
    jrn = "journalctl --user" if user_mode else "journalctl"
    lines = [f"wrote {unit_path}", "", "next steps:"]
    if not user_mode and user:
        lines += _account_steps(user, state_dir)
    if env_file is not None:
        lines.append(f"  edit secrets:  $EDITOR {shlex.quote(str(env_file))}")
    lines.append(f"  enable:        {ctl} daemon-reload && {ctl} enable --now tidegate")
    if user_mode:
        lines.append("  keep running after logout / start at boot:  "
                     "loginctl enable-linger $USER")
    lines += [
        f"  status:        {ctl} status tidegate",
        f"  reload config: {ctl} reload tidegate   (SIGHUP)",
        f"  logs:          tidegate logs -f   or   {jrn} -u tidegate -f",
        f"                 (JSON lines in {state_dir / 'logs' / 'gateway.jsonl'})",
        "",
    ]
    out.write("\n".join(lines))
    out.flush()


def _account_steps(user: str, state_dir: Path) -> list[str]:
    """``next steps`` lines for a system unit's user: create it when missing, own the
    state dir; a state dir under /root is flagged (another user cannot enter /root)."""
    import pwd
    lines = []
    try:
        pwd.getpwnam(user)
    except KeyError:
        lines.append(f"  create user:   useradd --system --home-dir {shlex.quote(str(state_dir))} "
                     f"--shell /usr/sbin/nologin {shlex.quote(user)}")
    lines.append(f"  state owner:   chown -R {shlex.quote(user)}: {shlex.quote(str(state_dir))}")
    if user != "root" and (state_dir == Path("/root") or Path("/root") in state_dir.parents):
        lines.append(f"  warning:       {state_dir} is under /root, which {user} cannot enter; "
                     f"set gateway.state_dir to e.g. /var/lib/tidegate")
    return lines


def _abs(p: Path | str, what: str) -> Path:
    """Absolute path that can go into a unit file unquoted (EnvironmentFile= and
    WorkingDirectory= take the rest of the line, ReadWritePaths= splits on spaces)."""
    path = Path(p).expanduser()
    if not path.is_absolute():
        path = path.absolute()
    if any(c.isspace() or c in "\"'\\" for c in str(path)):
        raise ValueError(f"{what}: {str(path)!r} must not contain whitespace, quotes or "
                         "backslashes (it goes into a systemd unit file)")
    return path


def _account(name: str, what: str) -> str:
    """A user or group name as ``User=``/``Group=`` take it (systemd.exec(5)): letters,
    digits, ``_``, ``-``, ``.``; not starting with a digit or ``-``."""
    import re
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", name or ""):
        raise ValueError(f"{what}: {name!r} is not a valid user or group name")
    return name


def _one_line(value: str, what: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError(f"{what}: must not contain a newline")
    if not value.strip():
        raise ValueError(f"{what}: must not be empty")
    return value


def _escape(value: str) -> str:
    # '%' starts a specifier in unit files (systemd.unit(5) "Specifiers").
    return value.replace("%", "%%")


def _path(p: Path) -> str:
    return _escape(str(p))


def _env(name: str, value: Path) -> str:
    return f"Environment={name}={_escape(str(value))}"


def _quote(arg: str) -> str:
    """Quote one ExecStart argument (systemd.service(5) "Command lines")."""
    s = arg.replace("%", "%%").replace("$", "$$")
    if s and not any(c.isspace() or c in "\"'\\;" for c in s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

