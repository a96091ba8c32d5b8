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
    state_dir: str = Field(
        DEFAULT_STATE_DIR,
        description=("sessions, transcripts, timeline.db, cron, logs, token ($TIDEGATE_STATE_DIR "
                     "overrides)"))
    bind: str = Field(
        "127.0.0.1",
        description="control API + webchat; loopback only (127.0.0.1, ::1, localhost)")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535,
        description="port of the control API and webchat; 0 = any free port (written to <state_dir>/gateway.json)")
    auth_token: str | None = Field(
        None,
        description=("bearer token for the control API; unset = generated into "
                     "<state_dir>/gateway.token."))
    shutdown_grace: Duration = Field(
        30.0,
        description=("on SIGTERM, how long running turns may finish before they are cancelled (the"
                     " rest resume at the next start)"))
    channel_start_timeout: Duration = Field(
        30.0, gt=0,
        description=("how long one chat channel may take to start (connect, log in); one that "
                     "takes longer is stopped and marked failed, the others start regardless"))
    channel_stop_timeout: Duration = Field(
        10.0, gt=0,
        description=("at shutdown, how long the chat channels may take to stop; one that takes "
                     "longer is cancelled, and one that ignores that is left behind: the "
                     "process exits anyway"))
    journal_fsync: bool = Field(
        True,
        description=("fsync the intake journal before a platform is acknowledged (false: a power "
                     "cut may lose accepted messages)"))
    public_base_url: str | None = Field(
        None,
        description="public https URL of this gateway, when webhooks reach it through a proxy.")

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
