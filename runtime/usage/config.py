"""Config sections ``pricing`` and ``budgets`` (see config.example.yaml)."""


from pydantic import Field, field_validator

from runtime.config_types import ConfigModel


class Price(ConfigModel):
    """USD per million tokens. ``cached_input``: input tokens read from the provider's
    prompt cache (default: ``input``); ``cache_write``: tokens written to it (default:
    ``input``)."""

    input: float = Field(ge=0,
        description="USD per million input tokens.")
    output: float = Field(ge=0,
        description="USD per million output tokens.")
    cached_input: float | None = Field(None, ge=0,
        description="USD per million cached input tokens; null = input.")
    cache_write: float | None = Field(None, ge=0,
        description="USD per million tokens written to the prompt cache; null = input.")


class AgentBudget(ConfigModel):
    daily_usd: float | None = Field(None, gt=0,
        description="This agent's cap per day.")
    monthly_usd: float | None = Field(None, gt=0,
        description="This agent's cap per month.")


class BudgetsSection(ConfigModel):
    """Spending caps in USD. ``timezone``: where a day and a month start (default: the
    default agent's ``user_timezone``). ``alert_at``: share of a cap at which the owner's
    route gets one alert. ``user_reserve``: share of a cap kept for user turns —
    background work (heartbeat, cron, subagents, system turns) stops at
    ``cap × (1 − user_reserve)``, user turns at the cap. ``alert_target``: ``last`` (the
    default agent's most recent route), ``none`` or ``<channel>:<to>[:<thread>]``."""

    daily_usd: float | None = Field(None, gt=0,
        description="all agents together, per day (from local midnight)")
    monthly_usd: float | None = Field(None, gt=0,
        description="all agents together, per month.")
    per_agent: dict[str, AgentBudget] = Field(
        {},
        description="e.g. {ops: {daily_usd: 2, monthly_usd: 30}}.")
    alert_at: float = Field(0.8, gt=0, le=1,
        description="one alert per cap and period at this share of it.")
    user_reserve: float = Field(0.05, ge=0, lt=1,
        description=("background work (heartbeat, cron, subagents) stops at cap x (1 - "
                     "user_reserve); user turns at the cap."))
    timezone: str | None = Field(
        None,
        description="where days/months start; default: the default agent's user_timezone.")
    alert_target: str = Field(
        "last",
        description="last (the default agent's latest route) | none | <channel>:<to>[:<thread>].")

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from zoneinfo import ZoneInfo
        try:
            ZoneInfo(v)
        except Exception:  # noqa: BLE001 - zoneinfo raises several types
            raise ValueError(f"unknown IANA timezone {v!r}") from None
        return v

    @property
    def enabled(self) -> bool:
        return bool(self.daily_usd or self.monthly_usd or any(
            b.daily_usd or b.monthly_usd for b in self.per_agent.values()))
