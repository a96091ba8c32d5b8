"""Config sections of failover (issue 10): auth profiles and cooldowns.
The gateway's schema (gateway/config/schema.py) embeds them; defaults follow seed 001 §2.3-§2.5."""


import re
from typing import Self

from pydantic import field_validator, model_validator

from runtime.config_types import ConfigModel, Duration

_PROFILE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class AuthProfileConfig(ConfigModel):
    """One credential of a provider: exactly one of ``api_key`` (literal or ``${ENV}``),
    ``api_key_env`` (read at call time) or ``api_key_command`` (prints a token, optionally
    JSON ``{token, expires_at | expires_in}``)."""

    id: str
    api_key: str | None = None
    api_key_env: str | None = None
    api_key_command: str | None = None

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

    billing: Duration = 5 * 3600.0
    auth: Duration = 3600.0
    rate_limit: Duration = 60.0
    transient: Duration = 0.0
