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


def install(loaded: LoadedConfig, *, user_mode: bool, dest_dir: str | None = None) -> int:
    """Write the unit (and env file, state dir); returns the exit code.

    A file that cannot be written (no root, a read-only or bogus ``--dest-dir``) is one
    ``error: cannot write ...`` line and exit 1, not a traceback.
    """
    from gateway.logs.pipeline import configure_logging, reset_logging

    state_dir = loaded.state_dir.resolve()
    config_path = loaded.path.resolve() if loaded.path else None
    # The steps are printed; the structlog event is for logs, so only warnings reach stderr.
    configure_logging(state_dir=None, level="warning")
    try:
        install_service(user_mode=user_mode, exec_start=exec_start_for(config_path),
                        state_dir=state_dir, config_path=config_path,
                        env_file=state_dir / "tidegate.env",
                        dest_dir=Path(dest_dir) if dest_dir else None)
    except OSError as exc:
        where = exc.filename or dest_dir or "the service unit"
        hint = "; run as root or use --user" if isinstance(exc, PermissionError) \
            and not user_mode else ""
        print(f"error: cannot write {where}: {exc.strerror or exc}{hint}", file=sys.stderr)
        return 1
    finally:
        reset_logging()
    return 0


def uninstall(*, user_mode: bool, dest_dir: str | None = None) -> int:
    """Stop and disable the unit (when systemctl is there), remove ``tidegate.service`` and
    reload systemd. The state dir, config and env file are kept. Exit 1 when there is no
    unit to remove or it cannot be removed."""
    import subprocess

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
        subprocess.run([ctl, *scope, "disable", "--now", UNIT_NAME], check=False,
                       capture_output=True)
    try:
        unit.unlink()
    except OSError as exc:
        print(f"error: cannot remove {unit}: {exc.strerror}", file=sys.stderr)
        return 1
    if ctl is not None:
        subprocess.run([ctl, *scope, "daemon-reload"], check=False, capture_output=True)
    print(f"removed {unit}" + (" (stopped and disabled it first)" if ctl else
                               " (systemctl not found: nothing was stopped)"))
    print("kept: the state dir, config.yaml and the env file")
    return 0
