"""``tidegate service install [--user]``: write the systemd unit for this installation."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from gateway.config.load import LoadedConfig
from gateway.service.unit import install_service


def exec_start_for(config_path: Path | None) -> str:
    """Absolute command line that starts this installation's gateway."""
    script = shutil.which("tidegate")
    argv0 = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "tidegate" and argv0.exists():
        script = str(argv0)
    base = script or f"{sys.executable} -m gateway.cli"
    cfg = f" --config {config_path.resolve()}" if config_path else ""
    return f"{base}{cfg} gateway"


DEFAULT_USER = "tidegate"


def _run_as(user_mode: bool, user_name: str | None, group_name: str | None,
            allow_root: bool) -> tuple[str | None, str | None, str | None]:
    """(user, group, error) for the unit: a system unit runs as ``user_name`` (default
    ``tidegate``), never as root (name ``root`` or uid 0) unless ``allow_root``; a user
    unit takes neither option."""
    import pwd
    if user_mode:
        if user_name or group_name:
            return None, None, ("error: --user-name/--group-name apply to system units "
                                "only (a --user unit runs as you)")
        return None, None, None
    user = user_name or DEFAULT_USER
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        uid = None  # created later (install prints the useradd line)
    if (user == "root" or uid == 0) and not allow_root:
        return None, None, (f"error: --user-name {user}: refusing to run the gateway as root "
                            f"(the agent's exec tool would run commands as root); use an "
                            f"unprivileged account, or add --allow-root")
    return user, group_name or user, None


def _uses_bwrap(loaded: LoadedConfig) -> bool:
    """Whether any agent's exec sandbox runs under bwrap (the unit then allows @mount)."""
    cfg = loaded.config
    return any(cfg.agent(a).sandbox.mode != "off" and cfg.agent(a).sandbox.backend == "bwrap"
               for a in cfg.agent_ids())


def writable_dirs(loaded: LoadedConfig) -> tuple[Path, ...]:
    """Directories besides the state dir the gateway writes: ``backup.dir`` and the
    directory of a ``timeline.path`` (as configured; the unit leaves out those inside the
    state dir)."""
    cfg = loaded.config
    out = []
    if cfg.backup.dir:
        out.append(Path(cfg.backup.dir).expanduser().absolute())
    if cfg.timeline.enabled and cfg.timeline.path:
        out.append(Path(cfg.timeline.path).expanduser().absolute().parent)
    return tuple(out)


def install(loaded: LoadedConfig, *, user_mode: bool, dest_dir: str | None = None,
            user_name: str | None = None, group_name: str | None = None,
            allow_root: bool = False) -> int:
    """Write the unit (and env file, state dir); returns the exit code.

    A system unit gets ``User=``/``Group=`` (``user_name``, default ``tidegate``; root is
    refused with exit 2 unless ``allow_root``). A file that cannot be written (no root, a
    read-only or bogus ``--dest-dir``) is one ``error: cannot write ...`` line and exit 1,
    not a traceback; a bad user or group name is exit 2.
    """
    from gateway.logs.pipeline import configure_logging, reset_logging

    user, group, problem = _run_as(user_mode, user_name, group_name, allow_root)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    state_dir = loaded.state_dir.resolve()
    config_path = loaded.path.resolve() if loaded.path else None
    # The steps are printed; the structlog event is for logs, so only warnings reach stderr.
    configure_logging(state_dir=None, level="warning")
    try:
        install_service(user_mode=user_mode, exec_start=exec_start_for(config_path),
                        state_dir=state_dir, config_path=config_path,
                        env_file=state_dir / "tidegate.env", user=user, group=group,
                        dest_dir=Path(dest_dir) if dest_dir else None,
                        sandbox=_uses_bwrap(loaded), writable=writable_dirs(loaded))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = exc.filename or dest_dir or "the service unit"
        hint = "; run as root or use --user" if isinstance(exc, PermissionError) \
            and not user_mode else ""
        print(f"error: cannot write {where}: {exc.strerror or exc}{hint}", file=sys.stderr)
        return 1
    finally:
        reset_logging()
    return 0


def _systemctl(ctl: str, args: list[str]) -> str | None:
    """Run ``systemctl ARGS``; None when it succeeded, else the error to print: the
    command, its exit code and its stderr."""
    import subprocess
    try:
        proc = subprocess.run([ctl, *args], check=False, capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`systemctl {' '.join(args)}` could not run: {exc}"
    if proc.returncode == 0:
        return None
    said = (proc.stderr or proc.stdout).strip()
    return (f"`systemctl {' '.join(args)}` failed (exit {proc.returncode})"
            + (f": {said}" if said else ""))


def uninstall(*, user_mode: bool, dest_dir: str | None = None) -> int:
    """Stop and disable the unit (when systemctl is there), remove ``tidegate.service`` and
    reload systemd. The state dir, config and env file are kept. Exit 1 when there is no
    unit to remove, it cannot be removed, or a ``systemctl`` call fails (the command, its
    exit code and stderr are printed; when stopping fails the unit is left in place)."""
    from gateway.service.unit import UNIT_NAME
    unit_dir = Path(dest_dir) if dest_dir else (
        Path.home() / ".config/systemd/user" if user_mode else Path("/etc/systemd/system"))
    unit = unit_dir / UNIT_NAME
    if not unit.exists():
        print(f"error: no unit at {unit}" + ("" if user_mode else " (a user unit? add --user)"),
              file=sys.stderr)
        return 1
    ctl = shutil.which("systemctl")
    scope = ["--user"] if user_mode else []
    if ctl is not None:
        failed = _systemctl(ctl, [*scope, "disable", "--now", UNIT_NAME])
        if failed:
            print(f"error: {failed}", file=sys.stderr)
            print(f"nothing removed: {unit} is kept so the service stays manageable; fix "
                  f"the above and run this again (or remove the file by hand)",
                  file=sys.stderr)
            return 1
    try:
        unit.unlink()
    except OSError as exc:
        print(f"error: cannot remove {unit}: {exc.strerror}", file=sys.stderr)
        return 1
    reload_failed = _systemctl(ctl, [*scope, "daemon-reload"]) if ctl is not None else None
    print(f"removed {unit}" + (" (stopped and disabled it first)" if ctl else
                               " (systemctl not found: nothing was stopped)"))
    print("kept: the state dir, config.yaml and the env file")
    if reload_failed:
        print(f"error: {reload_failed}", file=sys.stderr)
        return 1
    return 0
