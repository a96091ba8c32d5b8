"""``agents.defaults.subagents`` / ``agents.list[].subagents`` (seed 001 §6)."""


from pydantic import Field

from runtime.config_types import ConfigModel, Duration, section
from runtime.tools.config import ToolRules

DEFAULT_SUBAGENT_DENY = ["sessions_spawn", "cron", "message"]


class SubagentSettings(ConfigModel):
    """Limits of subagent runs. ``max_depth`` 1: a subagent cannot spawn; ``max_children``
    active runs per requester session; ``run_timeout`` seconds (None: the agent's turn
    timeout); ``tools``: the subagent tool policy layer (applied after layers 1-7)."""

    max_depth: int = Field(1, ge=0, le=5,
        description="1 = a subagent cannot spawn further subagents.")
    max_children: int = Field(5, ge=0, le=100,
        description="running subagents per requester session.")
    run_timeout: Duration | None = Field(
        None,
        description="per child run; null = this agent's timeout.")
    tools: ToolRules = Field(
        section(deny=DEFAULT_SUBAGENT_DENY),
        description="the subagent tool policy layer (after layers 1-7)")
