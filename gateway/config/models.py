"""The ``models`` section: providers, their models' options, timeouts and retries, and
the model refs agents name (issue 2; failover: runtime/providers/failover/config.py)."""


from typing import Any, Literal, Self

from pydantic import Field, ValidationError, field_validator, model_validator

from runtime.config_types import ConfigModel, Duration, Lazy, section
from runtime.providers.failover.config import AuthProfileConfig, Cooldowns, check_profiles
from runtime.providers.plugins import provider_plugin


class ModelOptions(ConfigModel):
    vision: bool | None = Field(
        None,
        description=("Whether this model takes images; null = a built-in guess from the model name"
                     " (anything unknown is text-only)."))  # None: built-in guess (runtime/media/vision.py)
    context_window: int | None = Field(None, ge=1,
        description=("The model's context window in tokens; null = the built-in table of common "
                     "models, else agents.*.context_tokens."))  # None: runtime/context/guard.py table


class ProviderConfig(ConfigModel):
    api: Literal["openai", "anthropic"] = Field(
        description=("openai (any OpenAI-compatible server: OpenAI, Ollama, vLLM, llama.cpp, "
                     "OpenRouter) | anthropic | the name of an installed provider plugin."))
    base_url: str | None = Field(
        None,
        description="base URL of the provider's API (an OpenAI-compatible server's /v1); null = the official API of `api`.")
    api_key: str | None = Field(
        None,
        description="one key = one auth profile called \"default\".")
    headers: dict[str, str] = Field(
        {},
        description="extra HTTP headers.")
    models: dict[str, ModelOptions] = Field(
        {},
        description="per-model options (optional)")
    max_concurrent: int | None = Field(None, ge=1,
        description="model calls in flight for this provider; null (default) = unlimited.")  # model calls in flight; None = unlimited
    auth_profiles: list[AuthProfileConfig] = Field(
        [],
        description=("instead of api_key: several credentials, tried in this order (the last one "
                     "that worked first)"))

    @model_validator(mode="after")
    def _profiles(self) -> Self:
        check_profiles(self.auth_profiles, self.api_key)
        return self

    @field_validator("api", mode="wrap")
    @classmethod
    def _plugin_api(cls, value: Any, handler: Any) -> Any:
        # openai | anthropic, or the name of an installed provider plugin (tidegate.providers)
        try:
            return handler(value)
        except ValidationError:
            if isinstance(value, str) and provider_plugin(value) is not None:
                return value
            raise


class ModelsSection(ConfigModel):
    providers: dict[str, Lazy[ProviderConfig]] = Field(
        {},
        description="name -> provider; models are referenced as <provider>/<model>.")
    timeout: Duration = Field(
        120.0,
        description="timeout of one model call (per attempt)")
    retries: int = Field(2, ge=0, le=10,
        description=("retries per auth profile of timeouts, 5xx and rate limits before rotating to"
                     " the next profile."))
    retry_backoff: Duration = Field(
        1.0,
        description="first retry delay (doubles, with jitter; a short server Retry-After wins)")
    max_attempts: int = Field(160, ge=1,
        description=("model call attempts per turn, all models and profiles together; the turn "
                     "timeout caps the time."))
    max_retry_wait: Duration = Field(
        60.0,
        description=("a Retry-After (or retry-after-ms, anthropic-ratelimit-*-reset) up to this is"
                     " waited out in place; longer ones cool the profile down."))
    cooldowns: Lazy[Cooldowns] = Field(
        section(),
        description=("how long an auth profile rests after a failure of each class (state in "
                     "<state_dir>/auth-state.json, survives restarts)"))


class ModelRef(ConfigModel):
    primary: str = Field(
        description="The model tried first, as <provider>/<model>.")
    fallbacks: list[str] = Field(
        [],
        description=("Models tried in order when every auth profile of the primary is failing or "
                     "cooling down."))
