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
    state_dir = loaded.state_dir.resolve()
    config_path = loaded.path.resolve() if loaded.path else None
    try:
        install_service(user_mode=user_mode, exec_start=exec_start_for(config_path),
                        state_dir=state_dir, config_path=config_path,
                        env_file=state_dir / "tidegate.env",
                        dest_dir=Path(dest_dir) if dest_dir else None)
    except PermissionError as exc:
        print(f"error: {exc}; run as root or use --user", file=sys.stderr)
        return 1
    return 0
