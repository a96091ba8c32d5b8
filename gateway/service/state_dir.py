"""The state dir's two guards: the control API token (``gateway.token``, mode 0600) and
the single-gateway lock (``gateway.lock``, fcntl). DESIGN.md "Operations".
"""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path


def load_or_create_token(state_dir: Path, configured: str | None) -> str:
    """``gateway.auth_token`` if set, else the token in ``<state_dir>/gateway.token``
    (generated with mode 0600 on first run)."""
    if configured:
        return configured
    path = state_dir / "gateway.token"
    try:
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


class GatewayLocked(RuntimeError):
    """Another gateway already runs on this state dir."""


def lock_state_dir(state_dir: Path) -> int:
    """Take ``<state_dir>/gateway.lock`` (fcntl, held for the process's life) so two
    gateways never share sessions, cron and outbox. Raises GatewayLocked."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / "gateway.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise GatewayLocked(f"another gateway (pid {holder}) is running on {state_dir}; "
                            f"stop it first or use another gateway.state_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
