"""The CLI's client for the running gateway's control API.

The gateway writes ``<state_dir>/gateway.json`` (pid, port) when it listens and its token to
``<state_dir>/gateway.token`` (unless ``gateway.auth_token`` is set), so every CLI command
that reads the same config can reach it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from gateway.config_load import LoadedConfig


class GatewayUnavailable(RuntimeError):
    """The gateway is not running (or not reachable on loopback)."""


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ControlClient:
    base_url: str
    token: str

    @classmethod
    def from_config(cls, loaded: LoadedConfig) -> ControlClient:
        cfg = loaded.config.gateway
        port = cfg.port
        try:
            info = json.loads((loaded.state_dir / "gateway.json").read_text())
            port = int(info.get("port") or port)
        except (OSError, ValueError):
            pass
        token = cfg.auth_token
        if not token:
            try:
                token = (loaded.state_dir / "gateway.token").read_text().strip()
            except OSError:
                token = ""
        host = "[::1]" if cfg.bind == "::1" else "127.0.0.1"
        return cls(f"http://{host}:{port}", token)

    def request(self, method: str, path: str, body: Any = None,
                timeout: float = 660.0) -> Any:
        """Call the API and decode JSON. Raises GatewayUnavailable or ApiError."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("error", exc.reason)
            except (ValueError, AttributeError):
                detail = exc.reason
            raise ApiError(exc.code, str(detail)) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise GatewayUnavailable(f"gateway not reachable at {self.base_url} "
                                     f"({getattr(exc, 'reason', exc)}); start it with "
                                     f"`tidegate gateway`") from None

    def is_up(self) -> bool:
        try:
            return bool(self.request("GET", "/healthz", timeout=2).get("ok"))
        except (GatewayUnavailable, ApiError):
            return False
