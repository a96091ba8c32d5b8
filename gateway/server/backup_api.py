"""Control API route for ``tidegate backup create`` through the running gateway (bearer
token required), so the archive is taken at one instant while the gateway serves
(gateway/backup/cut.py: the gateway briefly holds its own writers):

``POST /api/backup`` ``{"to": absolute path | null, "force": bool, "include_secrets":
bool | null}`` -> ``{"ok": true, "file", "bytes", "files", "secrets", "secrets_left_out",
"timeline_sessions", "timeline_events", "cut": {"at", "hold_ms"}, "duration_s"}``;
400 with ``{"ok": false, "error"}`` when the backup failed (the message names the file and
the cause, as the CLI prints it) or the request is malformed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.server.control_api import require_token


def backup_routes(gw: Any) -> list[web.RouteDef]:
    async def create(request: web.Request) -> web.Response:
        """Make a backup now, taken at one instant (`{"to", "force",
        "include_secrets"}`); a 400 names what failed."""
        from gateway.backup.archive import BackupError
        try:
            body = await request.json()
            to, force, secrets = body.get("to"), body.get("force", False), \
                body.get("include_secrets")
            if to is not None and not (isinstance(to, str) and Path(to).is_absolute()):
                raise ValueError("to: an absolute path, or null for backup.dir")
            if not isinstance(force, bool) or secrets not in (None, True, False):
                raise ValueError("force and include_secrets: true or false")
        except (ValueError, AttributeError) as exc:
            return web.json_response({"ok": False, "error": str(exc)}, status=400)
        started = time.monotonic()
        try:
            made = await gw.backup.create(dest=Path(to) if to else None,
                                          include_secrets=secrets, overwrite=force)
        except BackupError as exc:
            return web.json_response({"ok": False, "error": str(exc)}, status=400)
        tl = made.timeline or {}
        return web.json_response({
            "ok": True, "file": str(made.path), "bytes": made.bytes, "files": made.files,
            "secrets": made.secrets, "secrets_left_out": made.secrets_left_out,
            "timeline_sessions": tl.get("sessions", 0), "timeline_events": tl.get("events", 0),
            "cut": made.cut, "duration_s": round(time.monotonic() - started, 3)})

    return [web.post("/api/backup", require_token(gw, create))]
