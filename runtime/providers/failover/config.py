"""Config sections of failover (issue 10): auth profiles and cooldowns.
The gateway's schema (gateway/config/schema.py) embeds them; defaults follow seed 001 §2.3-§2.5."""


import re
from typing import Self

from pydantic import Field, field_validator, model_validator

from runtime.config_types import ConfigModel, Duration

_PROFILE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class AuthProfileConfig(ConfigModel):
    """One credential of a provider: exactly one of ``api_key`` (literal or ``${ENV}``),
    ``api_key_env`` (read at call time) or ``api_key_command`` (prints a token, optionally
    JSON ``{token, expires_at | expires_in}``)."""

    id: str = Field(
        description="Name of this credential in logs, status and auth-state.json (never the key).")
    api_key: str | None = Field(
        None,
        description="The key itself, usually written as ${VAR}.")
    api_key_env: str | None = Field(
        None,
        description="Name of an environment variable read at call time.")
    api_key_command: str | None = Field(
        None,
        description=("A command that prints a token or JSON {\"token\", \"expires_at\"|\"expires_in\"}; "
                     "refreshed 5 min before expiry and after a 401; 10 s timeout."))

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _PROFILE_ID.fullmatch(v or ""):
            raise ValueError("profile id must be 1-64 letters, digits, '.', '-' or '_'")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        given = [k for k in ("api_key", "api_key_env", "api_key_command")
                 if getattr(self, k) not in (None, "")]
        if len(given) != 1:
            what = "has no key" if not given else f"has several keys ({', '.join(given)})"
            raise ValueError(f"profile {self.id!r} {what}: give exactly one of api_key, "
                             f"api_key_env, api_key_command")
        return self


def check_profiles(profiles: list[AuthProfileConfig], api_key: str | None) -> None:
    """Raise ValueError for duplicate profile ids or ``api_key`` next to ``auth_profiles``."""
    seen: set[str] = set()
    for i, p in enumerate(profiles):
        if p.id in seen:
            raise ValueError(f"auth_profiles.{i}.id: duplicate profile id {p.id!r}")
        seen.add(p.id)
    if profiles and api_key:
        raise ValueError("api_key: give either api_key (one profile) or auth_profiles")


class Cooldowns(ConfigModel):
    """How long a profile rests after a failure of each class (0 = not at all)."""

    billing: Duration = Field(
        5 * 3600.0,
        description="402, insufficient_quota, \"credit balance is too low\".")
    auth: Duration = Field(
        3600.0,
        description="401, 403, invalid key, a failing api_key_command.")
    rate_limit: Duration = Field(
        60.0,
        description="429/overloaded after the retries (at least the server's wait)")
    transient: Duration = Field(
        0.0,
        description=("timeouts, 5xx, connection errors after the retries (0 = no rest, next "
                     "profile)"))
