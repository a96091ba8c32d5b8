"""The ``gateway`` section read without pydantic: what ``agent -m`` and ``chat`` need to
find the running gateway (state dir, bind, token), in a few milliseconds instead of the
~100 ms that importing pydantic and building even one model costs at CLI start
(bench/operator_bench.py).

Only a *plain* section takes this path — known keys (snake_case or camelCase), each of
the type the schema wants, ``bind`` on loopback; anything else returns None and the
caller validates the section with :class:`gateway.config.gateway_section.GatewaySection`,
which names the bad key. The running gateway validated the whole file at its start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = "~/.tidegate"
DEFAULT_PORT = 18789
LOOPBACK = ("127.0.0.1", "::1", "localhost")

# key -> accepted types (bool is an int in Python: checked first, see _plain)
_TYPES: dict[str, tuple[type, ...]] = {
    "state_dir": (str,), "bind": (str,), "port": (int,), "auth_token": (str, type(None)),
    "shutdown_grace": (str, int, float), "journal_fsync": (bool,),
    "public_base_url": (str, type(None)),
}


@dataclass(frozen=True, slots=True)
class QuickGateway:
    """The fields of ``GatewaySection`` a control-API client reads."""

    state_dir: str = DEFAULT_STATE_DIR
    bind: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    auth_token: str | None = None

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def quick_gateway(section: dict[str, Any]) -> QuickGateway | None:
    """A :class:`QuickGateway` for a plain section (see the module docstring), else None."""
    values: dict[str, Any] = {}
    for key, value in section.items():
        name = _snake(str(key))
        kinds = _TYPES.get(name)
        if kinds is None or name in values or not _plain(value, kinds):
            return None
        values[name] = value
    if values.get("bind", "127.0.0.1") not in LOOPBACK:
        return None
    if not 0 <= values.get("port", DEFAULT_PORT) <= 65535:
        return None
    return QuickGateway(**{k: v for k, v in values.items()
                           if k in ("state_dir", "bind", "port", "auth_token")})


def _plain(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)
