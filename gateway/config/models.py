"""The ``models`` section: providers, their models' options, timeouts and retries, and
the model refs agents name (issue 2; failover: runtime/providers/failover/config.py)."""


from typing import Literal, Self

from pydantic import Field, model_validator

from runtime.config_types import ConfigModel, Duration, Lazy, section
from runtime.providers.failover.config import AuthProfileConfig, Cooldowns, check_profiles


class ModelOptions(ConfigModel):
    vision: bool | None = None  # None: built-in guess (runtime/media/vision.py)
    context_window: int | None = Field(None, ge=1)  # None: runtime/context/guard.py table


class ProviderConfig(ConfigModel):
    api: Literal["openai", "anthropic"]
    base_url: str | None = None
    api_key: str | None = None
    headers: dict[str, str] = {}
    models: dict[str, ModelOptions] = {}
    max_concurrent: int | None = Field(None, ge=1)  # model calls in flight; None = unlimited
    auth_profiles: list[AuthProfileConfig] = []

    @model_validator(mode="after")
    def _profiles(self) -> Self:
        check_profiles(self.auth_profiles, self.api_key)
        return self


class ModelsSection(ConfigModel):
    providers: dict[str, Lazy[ProviderConfig]] = {}
    timeout: Duration = 120.0
    retries: int = Field(2, ge=0, le=10)
    retry_backoff: Duration = 1.0
    max_attempts: int = Field(160, ge=1)
    max_retry_wait: Duration = 60.0
    cooldowns: Lazy[Cooldowns] = section()


class ModelRef(ConfigModel):
    primary: str
    fallbacks: list[str] = []
