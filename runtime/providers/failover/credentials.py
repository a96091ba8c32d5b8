"""Where an auth profile's key comes from (seed 001 §2.3 "Token 自动刷新"): a literal key,
an environment variable read at call time, or a command printing a short-lived token.

A command's output is either the token (first line) or JSON ``{"token": ..., "expires_at":
<epoch seconds | RFC 3339>}`` (``expires_in`` seconds also accepted). The token is cached
and fetched again 5 minutes before it expires (the seed's Copilot rule) and after an
``auth`` error (:meth:`Credential.invalidate`). The command is killed after
``COMMAND_TIMEOUT`` (10 s); its output never reaches a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from runtime.clock import Clock, parse_iso

log = structlog.get_logger(__name__)

COMMAND_TIMEOUT = 10.0
REFRESH_BEFORE = 300.0  # seconds before expiry a command token is fetched again


class CredentialError(Exception):
    """The profile has no usable key now (unset variable, failing command). The message
    names the profile and the cause, never a token."""


@dataclass
class Credential:
    """One profile's key source. ``kind`` is key | env | command; ``source`` the literal
    key, the variable name or the command line."""

    provider: str
    profile: str
    kind: str
    source: str
    env: Mapping[str, str] | None = None
    token: str | None = None
    expires_at: float | None = None
    fetches: int = 0

    def describe(self) -> str:
        """What status may show: never the key itself."""
        return {"key": "api_key", "env": f"api_key_env {self.source}",
                "command": "api_key_command"}[self.kind]

    def invalidate(self) -> bool:
        """Forget a command token (after an auth error). True when a fresh one can be
        fetched (command profiles only)."""
        if self.kind != "command":
            return False
        self.token, self.expires_at = None, None
        return True

    def expires_in(self, now: float) -> float | None:
        return None if self.expires_at is None else self.expires_at - now

    async def get(self, clock: Clock) -> str:
        """The key to send now. Raises CredentialError."""
        if self.kind == "key":
            return self.source
        if self.kind == "env":
            value = (self.env if self.env is not None else os.environ).get(self.source)
            if not value:
                raise CredentialError(f"{self.provider}/{self.profile}: api_key_env "
                                      f"{self.source} is not set")
            return value
        now = clock.time()
        if self.token and (self.expires_at is None or now < self.expires_at - REFRESH_BEFORE):
            return self.token
        self.token, self.expires_at = await self._run(clock)
        self.fetches += 1
        log.info("auth_token_refreshed", provider=self.provider, profile=self.profile,
                 expires_in_s=None if self.expires_at is None else round(self.expires_at - now))
        return self.token

    async def _run(self, clock: Clock) -> tuple[str, float | None]:
        where = f"{self.provider}/{self.profile}: api_key_command"
        try:
            proc = await asyncio.create_subprocess_shell(
                self.source, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)
        except OSError as exc:
            raise CredentialError(f"{where} could not start ({exc.strerror})") from None
        try:
            async with clock.timeout(COMMAND_TIMEOUT):
                out, err = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the shell and whatever it started
            await proc.wait()
            raise CredentialError(f"{where} timed out after {COMMAND_TIMEOUT:g}s") from None
        if proc.returncode != 0:
            raise CredentialError(f"{where} exited with {proc.returncode} (stderr: "
                                  f"{len(err)} bytes, redacted)")
        return parse_token(out.decode("utf-8", "replace"), clock.time(), where)


def parse_token(text: str, now: float, where: str) -> tuple[str, float | None]:
    """(token, expires_at epoch seconds | None) from a command's stdout. Raises
    CredentialError for empty output or JSON without a token."""
    text = text.strip()
    if not text:
        raise CredentialError(f"{where} printed nothing")
    if not text.startswith("{"):
        return text.splitlines()[0].strip(), None
    try:
        data = json.loads(text)
        token = str(data.get("token") or data.get("access_token") or "")
        if "expires_in" in data:
            return token or _missing(where), now + float(data["expires_in"])
        exp = data.get("expires_at")
        if exp is None:
            return token or _missing(where), None
        when = float(exp) if isinstance(exp, (int, float)) else parse_iso(str(exp))
        return token or _missing(where), when
    except (ValueError, TypeError, AttributeError):
        raise CredentialError(f"{where} printed JSON without a usable token/expires_at") \
            from None


def _missing(where: str) -> str:
    raise CredentialError(f"{where} printed JSON without a token")
