"""``tidegate service install [--user]``: write the systemd unit for this installation."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from gateway.config_load import LoadedConfig
from gateway.systemd import install_service


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
    from gateway.logs import configure_logging, reset_logging

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
