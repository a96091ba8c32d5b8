"""Matrix's live check (``ChannelPlugin.probe``): ``GET /account/whoami`` on the
homeserver with the access token, which must name the configured ``user_id``.

With a password instead of a token the check logs in as its own short-lived device
(``<device_id>-PROBE``), asks whoami and logs that device out again, so the gateway's own
device and its token are never touched.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from channels.probing import http_json

API = "/_matrix/client/v3"


def _get(base: str, path: str, token: str, timeout: float, **kw: Any) -> Any:
    return http_json(f"{base}{API}{path}", timeout=timeout,
                     headers={"Authorization": f"Bearer {token}",
                              "Content-Type": "application/json"}, **kw)


def _check(account: Any, timeout: float) -> tuple[bool, str]:
    base = str(account.homeserver).rstrip("/")
    token, device = (str(account.access_token).strip() if account.access_token else None), None
    if token is None:
        login = {"type": "m.login.password", "password": str(account.password),
                 "identifier": {"type": "m.id.user", "user": account.user_id},
                 "device_id": f"{account.device_id}-PROBE",
                 "initial_device_display_name": "tidegate probe"}
        body, error = http_json(f"{base}{API}/login", data=json.dumps(login).encode(),
                                method="POST", timeout=timeout, refused="password refused",
                                headers={"Content-Type": "application/json"})
        if error:
            return False, f"login: {error}"
        token, device = body.get("access_token"), body.get("device_id")
        if not token:
            return False, f"login: no access_token in the answer {str(body)[:100]}"
    try:
        body, error = _get(base, "/account/whoami", token, timeout)
    finally:
        if device is not None:
            _get(base, "/logout", token, timeout, data=b"{}", method="POST")
    if error:
        return False, error
    who = body.get("user_id")
    if who != account.user_id:
        return False, f"the token belongs to {who}, not to user_id {account.user_id}"
    how = "password login" if device is not None else "access token"
    return True, f"{who} on {base} ({how})"


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """``(True, "@bot:server on <homeserver> (access token)")`` or ``(False, why)``:
    ``HTTP 401 (token rejected)`` for a bad token, ``login: HTTP 403 (password
    refused)`` for a wrong password, ``unreachable: ...``."""
    return await asyncio.to_thread(_check, account, timeout)

