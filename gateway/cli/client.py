"""The CLI's client for the running gateway's control API.

The gateway writes ``<state_dir>/gateway.json`` (pid, port, bind, instance) when it listens
and its token to ``<state_dir>/gateway.token`` (unless ``gateway.auth_token`` is set), so
every CLI command that reads the same config can reach it.

Hermetic by design: without ``gateway.json`` (or with one whose pid is dead) the gateway
of this state dir is not running, and the client never tries a default port, where some
other gateway may listen. When the process on the port answers for another state dir
(``/healthz`` carries an ``instance`` id derived from the state dir), the error says so.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config.load import LoadedConfig


class GatewayUnavailable(RuntimeError):
    """The gateway is not running (or not reachable on loopback)."""


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (an exited child its parent has not reaped yet — a zombie —
    counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@dataclass
class ControlClient:
    """``base_url`` is None when this state dir's gateway is not running (``why`` says how
    we know); ``request`` then raises GatewayUnavailable without touching the network."""

    base_url: str | None
    token: str
    instance: str = ""
    why: str = ""
    token_source: str = "the token"

    @classmethod
    def from_config(cls, loaded: LoadedConfig) -> ControlClient:
        cfg = loaded.config.gateway
        token, source = cfg.auth_token, "gateway.auth_token in the config"
        if not token:
            source = str(loaded.state_dir / "gateway.token")
            try:
                token = (loaded.state_dir / source).read_text().strip()
            except OSError:
                token, source = "", f"{source}, which is unreadable"
        me = loaded.instance_id
        info_path = loaded.state_dir / "gateway.json"
        try:
            info = json.loads(info_path.read_text())
            port, pid = int(info["port"]), int(info.get("pid") or 0)
            bind = str(info.get("bind") or cfg.bind)
        except FileNotFoundError:
            return cls(None, token, me, f"no gateway is running for state dir "
                                        f"{loaded.state_dir}", source)
        except (OSError, ValueError, KeyError, TypeError):
            return cls(None, token, me, f"{info_path} is unreadable", source)
        if pid and not pid_alive(pid):
            return cls(None, token, me, f"the gateway of state dir {loaded.state_dir} "
                                        f"(pid {pid}) has exited", source)
        host = "[::1]" if bind == "::1" else "127.0.0.1"
        return cls(f"http://{host}:{port}", token, me, token_source=source)

    def request(self, method: str, path: str, body: Any = None,
                timeout: float = 660.0) -> Any:
        """Call the API and decode JSON. Raises GatewayUnavailable or ApiError (a 401 from
        a gateway of another state dir is GatewayUnavailable naming that)."""
        with self._open(method, path, body, timeout) as resp:
            return json.loads(resp.read() or b"null")

    def stream(self, path: str, body: Any, timeout: float = 660.0) -> Iterator[dict]:
        """POST ``body`` and yield each NDJSON line of the response as a dict (see
        ``/api/agent/stream``). Raises as :meth:`request`."""
        with self._open("POST", path, body, timeout) as resp:
            for raw in resp:
                if raw.strip():
                    yield json.loads(raw)

    def _open(self, method: str, path: str, body: Any,
              timeout: float) -> http.client.HTTPResponse:
        """The response (2xx) of one request. Plain ``http.client``: the control API is
        HTTP on loopback, and urllib.request's extra imports cost ``agent -m`` ~20 ms of
        CPU at every start (bench/operator_bench.py)."""
        if self.base_url is None:
            raise GatewayUnavailable(f"{self.why}; start it with `tidegate gateway`")
        host, _, port = self.base_url.removeprefix("http://").rpartition(":")
        conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
        data = json.dumps(body).encode() if body is not None else None
        try:
            conn.request(method, path, body=data, headers={
                "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise self._unreachable(exc) from None
        if resp.status < 400:
            return resp
        with resp:
            err = self._http_error(resp)
        if err.status == 401 and path != "/healthz":
            raise (self._foreign_error() if self._foreign() else self._rejected()) from None
        raise err

    def _rejected(self) -> ApiError:
        # this state dir's own gateway: the CLI's token is not the one it holds
        return ApiError(401, f"the gateway on {self.base_url} rejected the token "
                             f"({self.token_source}); use the token the gateway runs with "
                             f"(the same config and environment as its service), or restart "
                             f"it to adopt this one")

    @staticmethod
    def _http_error(resp: http.client.HTTPResponse) -> ApiError:
        try:
            detail = json.loads(resp.read()).get("error", resp.reason)
        except (ValueError, AttributeError, OSError):
            detail = resp.reason
        return ApiError(resp.status, str(detail))

    def _unreachable(self, exc: Exception) -> GatewayUnavailable:
        return GatewayUnavailable(f"gateway not reachable at {self.base_url} "
                                  f"({getattr(exc, 'reason', exc)}); start it with "
                                  f"`tidegate gateway`")

    def _foreign_error(self) -> GatewayUnavailable:
        return GatewayUnavailable(
            f"the gateway on {self.base_url} belongs to another state dir; this state "
            f"dir's gateway is not running (start it with `tidegate gateway`, or point "
            f"--config at the other installation)")

    def _foreign(self) -> bool:
        try:
            health = self.request("GET", "/healthz", timeout=2)
        except (ApiError, GatewayUnavailable):
            return False
        return isinstance(health, dict) and health.get("instance") not in (None,
                                                                           self.instance)

    def is_up(self) -> bool:
        """True when this state dir's gateway answers (a foreign one does not count)."""
        try:
            health = self.request("GET", "/healthz", timeout=2)
        except (GatewayUnavailable, ApiError):
            return False
        return bool(health.get("ok")) and health.get("instance") in (None, self.instance)
