"""What a gateway shows while it waits for PostgreSQL at start
(runtime/storage/postgres/wait.py): ``<state_dir>/gateway-waiting.json`` (``{"pid",
"waiting_for", "since", "attempts", "last_error", "retry_in_s"}``, read by ``tidegate
status`` while the control API is not up yet) and the service manager's status line
(``STATUS=waiting for PostgreSQL ...``, with the start timeout extended meanwhile).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

WAITING_FILE = "gateway-waiting.json"
EXTEND_USEC = 60_000_000  # each failed attempt gives the start 60 s more


async def wait_for_database(gw: Any) -> Any:
    """The migrated asyncpg pool for ``gw.config.storage``, waiting as long as it takes
    (or until ``gw.start_abort`` is set: StartAborted). Sets ``gw.waited_for_database``
    when it had to wait."""
    from runtime.storage.postgres.wait import open_database_waiting
    path = Path(gw.state_dir) / WAITING_FILE

    def on_wait(state: dict[str, Any] | None) -> None:
        if state is None:  # reached after waiting: the cluster treats it as an outage
            gw.waited_for_database = True
            path.unlink(missing_ok=True)
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), **state}))
        tmp.replace(path)
        if gw.notifier is not None:
            gw.notifier.notify(f"EXTEND_TIMEOUT_USEC={EXTEND_USEC}",
                               f"STATUS=waiting for PostgreSQL (attempt {state['attempts']})")
    try:
        return await open_database_waiting(gw.config.storage, clock=gw.clock,
                                           on_wait=on_wait, stop=gw.start_abort)
    finally:
        path.unlink(missing_ok=True)


def read_waiting(state_dir: Path) -> dict[str, Any] | None:
    """The waiting state a starting gateway of ``state_dir`` wrote, or None (no file, an
    unreadable one, or its process is gone)."""
    try:
        state = json.loads((Path(state_dir) / WAITING_FILE).read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if isinstance(state, dict) else None
