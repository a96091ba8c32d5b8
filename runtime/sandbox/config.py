"""``agents.*.sandbox``: where an agent's exec commands run (docs/exec.md "Sandbox")."""

from typing import Literal

from pydantic import Field, field_validator

from runtime.config_types import ConfigModel


class SandboxSettings(ConfigModel):
    """The sandbox of one agent's ``exec`` commands."""

    mode: Literal["off", "non-main", "all"] = Field(
        "off", description="off: commands run on the host; non-main: in the sandbox for "
        "every session but the agent's main session (agent:<id>:main), and in it too for "
        "a turn triggered by a sender who is not an owner; all: always.")
    backend: Literal["bwrap", "docker"] = Field(
        "bwrap", description="bwrap (bubblewrap, Debian package bubblewrap) or docker.")
    network: bool = Field(False, description="Give sandboxed commands network access.")
    cpu_seconds: int = Field(60, ge=1, description="CPU time limit of one command (s).")
    memory_mb: int = Field(1024, ge=16, description="Address-space limit of one command "
                           "(MiB).")
    max_processes: int = Field(256, ge=4, description="Processes one command may have at "
                               "once (a fork bomb stops there).")
    image: str = Field("debian:stable-slim", description="docker: the image commands run "
                       "in (the workspace is mounted at the same path).")

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: object) -> object:
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false
