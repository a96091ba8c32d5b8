"""The ``gateway`` section of config.yaml on its own (state dir, bind, port, token).

Its own module so that CLI commands which only talk to the running gateway (``agent -m``,
``chat``) can read it without building the whole config schema (see
``gateway.config.load.load_gateway_section``).
"""


from pathlib import Path

from pydantic import Field, field_validator

from gateway.config.quick import DEFAULT_PORT, DEFAULT_STATE_DIR, LOOPBACK
from runtime.config_types import ConfigModel, Duration

__all__ = ["DEFAULT_PORT", "DEFAULT_STATE_DIR", "GatewaySection"]


class GatewaySection(ConfigModel):
    state_dir: str = DEFAULT_STATE_DIR
    bind: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    auth_token: str | None = None
    shutdown_grace: Duration = 30.0
    journal_fsync: bool = True
    public_base_url: str | None = None

    @field_validator("bind")
    @classmethod
    def _loopback_only(cls, v: str) -> str:
        # The control API carries the token; it must not be reachable from the network.
        if v not in LOOPBACK:
            raise ValueError("must be a loopback address (127.0.0.1, ::1 or localhost)")
        return v

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()
