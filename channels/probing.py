"""Running a channel plugin's live credential check (``ChannelPlugin.probe``,
``channels/sdk.py``) and the HTTP helper the built-in probes share.

:func:`check_account` is what ``tidegate channels status --probe``, ``tidegate doctor``
and ``tidegate setup`` call: ``(ok, detail)`` where ``ok`` is None for a plugin that
offers no probe, the detail with every secret answer of the account replaced by
``***``; a probe that raises or overruns its timeout is a failure, never a crash.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

NO_PROBE = ("no live check: the {name} plugin offers none (check it by starting the "
            "gateway: tidegate status)")


def http_json(url: str, *, headers: dict[str, str] | None = None, data: bytes | None = None,
              method: str | None = None, timeout: float = 10.0,
              refused: str = "token rejected") -> tuple[dict[str, Any] | None, str | None]:
    """One HTTP request answered with JSON: ``(body, None)``, or ``(None, why)`` for an
    HTTP error (``HTTP 401 (token rejected)``: ``refused`` names what a 401/403 means),
    an unreachable host or a non-JSON body. Never raises."""
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return None, (f"HTTP {exc.code} ({refused})" if exc.code in (401, 403)
                      else f"HTTP {exc.code}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"unreachable: {getattr(exc, 'reason', exc)}"
    return (body if isinstance(body, dict) else {"value": body}), None


def secret_values(plugin: Any, account: Any) -> list[str]:
    """The account's values of the plugin's secret setup fields (to redact; values under
    4 characters are left alone: replacing every ``s`` of a detail hides nothing)."""
    out = []
    for f in getattr(plugin, "setup", ()) or ():
        value = getattr(account, f.key, None)
        if f.secret and isinstance(value, str) and len(value) >= 4:
            out.append(value)
    return out


def unset_secret(plugin: Any, name: str, account: Any) -> str | None:
    """``channels.<name>.<key>: ${VAR} is not set`` for a secret that still reads as a
    ``${VAR}`` reference (the env file was not read), else None."""
    for f in getattr(plugin, "setup", ()) or ():
        value = getattr(account, f.key, None)
        if f.secret and isinstance(value, str) and "${" in value:
            return f"channels.{name}.{f.key}: {value} is not set (see --env-file)"
    return None


async def check_account(plugin: Any, account: Any, timeout: float = 10.0
                        ) -> tuple[bool | None, str]:
    """Run ``plugin.probe(account, timeout)``: ``(True, detail)`` checked,
    ``(False, why)`` refused or unreachable, ``(None, message)`` when the plugin has no
    probe. Never raises; secrets are redacted from the detail."""
    probe = getattr(plugin, "probe", None)
    name = getattr(plugin, "name", "?")
    if probe is None:
        return None, NO_PROBE.format(name=name)
    unset = unset_secret(plugin, name, account)
    if unset:
        return False, unset
    try:
        ok, detail = await asyncio.wait_for(probe(account, timeout), timeout + 5)
    except TimeoutError:
        ok, detail = False, f"no answer within {timeout:g}s"
    except Exception as exc:  # noqa: BLE001 - a broken probe is a failed check
        ok, detail = False, f"the check failed: {type(exc).__name__}: {exc}"
    detail = str(detail)
    for secret in secret_values(plugin, account):
        detail = detail.replace(secret, "***")
    return bool(ok), detail[:300]
