"""The ``agents`` section: defaults and per-agent settings (model, workspace, heartbeat,
compaction, exec), merged by :meth:`gateway.config.schema.Config.agent` (issue 2, seed 001)."""


import re
import typing
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.alias_generators import to_snake

from gateway.config.models import ModelRef
from runtime.config_types import (
    ConfigModel,
    Duration,
    Lazy,
    format_validation_error,
    section,
    section_defaults,
)
from runtime.context.guard import ContextGuard
from runtime.sandbox.config import SandboxSettings
from runtime.subagents.config import SubagentSettings
from runtime.tool_loop import ToolLoopConfig
from runtime.tools.config import AgentToolRules
from scheduler.heartbeat.rules import parse_hhmm


def _check_tz(v: str) -> str:
    from zoneinfo import ZoneInfo

    try:
        ZoneInfo(v)
    except Exception:  # noqa: BLE001 - zoneinfo raises several types
        raise ValueError(f"unknown IANA timezone {v!r}") from None
    return v


class ActiveHours(ConfigModel):
    start: str = Field(
        "00:00",
        description="Start of the window, HH:MM (00:00-23:59).")
    end: str = Field(
        "24:00",
        description="End of the window, HH:MM (00:00-24:00); a window may cross midnight.")
    timezone: str = Field(
        "user",
        description="IANA timezone of the window, or user for the agent's user_timezone.")

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return v if v == "user" else _check_tz(v)

    @field_validator("start")
    @classmethod
    def _start(cls, v: str) -> str:
        parse_hhmm(str(v))  # 00:00-23:59; "24:00" is an end only
        return str(v).strip()

    @field_validator("end")
    @classmethod
    def _end(cls, v: str) -> str:
        parse_hhmm(str(v), allow_24=True)  # "24:00" = midnight at the end of the day
        return str(v).strip()


class HeartbeatConfig(ConfigModel):
    every: Duration = Field(
        1800.0,
        description="interval between beats; 0 = off.")
    prompt: str | None = Field(
        None,
        description=("default: read HEARTBEAT.md, follow it strictly, reply HEARTBEAT_OK if "
                     "nothing needs attention."))
    target: str = Field(
        "none",
        description="none | last (last route of the session) | <channel>:<to>[:<thread>].")
    model: str | None = Field(
        None,
        description="model override for beats.")
    session: str | None = Field(
        None,
        description="default: the agent's main session (agent:<id>:main)")
    active_hours: ActiveHours | None = Field(
        None,
        description=("outside: beat skipped; crossing midnight works; user = user_timezone; HH:MM "
                     "00:00-23:59, end may be 24:00."))
    ack_max_chars: int = Field(300, ge=0,
        description="HEARTBEAT_OK plus at most this much text counts as \"nothing to report\".")
    timeout: Duration | None = Field(
        None,
        description="per beat; null = the agent's timeout.")

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        parts = v.split(":")
        if v not in ("none", "last") and (len(parts) < 2 or not parts[0] or not parts[1]):
            raise ValueError("expected none, last or <channel>:<to>[:<thread>]")
        return v

    @field_validator("session")
    @classmethod
    def _session(cls, v: str | None) -> str | None:
        if v is not None and v != "main" and not v.lower().startswith("agent:"):
            raise ValueError("expected main or a session key agent:<agent>:...")
        return v


ToolPolicy = AgentToolRules  # agents.*.tools (policy layers 5 and 6)


class CompactionConfig(ConfigModel):
    enabled: bool = Field(
        True,
        description="summarise older messages when the context nears the budget.")
    threshold: float = Field(0.8, gt=0.0, le=1.0,
        description="compact when the context exceeds this share of the budget.")
    keep_ratio: float = Field(0.4, gt=0.0, lt=1.0,
        description="share of the budget kept verbatim (the newest messages)")


class ExecConfig(ConfigModel):
    timeout: Duration = Field(
        60.0,
        description="default timeout of one exec command.")
    max_output_chars: int = Field(20_000, ge=100,
        description="head and tail kept beyond this.")
    background_max: int = Field(8, ge=0,
        description="concurrent background commands.")


class AgentSettings(ConfigModel):
    """One agent's settings: ``agents.defaults`` merged with its ``agents.list`` entry."""

    id: str = Field(
        "main",
        description="The agent id (set in agents.list; lower-case letters, digits, - and _).")
    name: str | None = Field(
        None,
        description="display name used in the identity section of the prompt.")
    model: str | ModelRef | None = Field(
        None,
        description=("<provider>/<model>, or {primary: ..., fallbacks: [...]}; null = built-in "
                     "echo provider."))
    workspace: str | None = Field(
        None,
        description=("default <state_dir>/workspace/<agent>; bootstrap files AGENTS.md SOUL.md "
                     "USER.md TOOLS.md MEMORY.md HEARTBEAT.md live here."))
    timeout: Duration = Field(
        600.0,
        description="timeout of a whole turn (all model calls and tools)")
    model_timeout: Duration | None = Field(
        None,
        description="per model call; null = models.timeout.")
    tool_timeout: Duration = Field(
        120.0,
        description="timeout of one tool call.")
    user_timezone: str = Field(
        "UTC",
        description=("IANA name; used for time awareness, daily reset, active hours, event "
                     "timestamps."))
    owners: list[str] = Field([], description=(
        "Canonical sender ids of the agent's owners (an identity-link name, or "
        "'<channel>:<platform user id>'): only they write the shared agent memory "
        "(MEMORY.md, memory/) from a chat, and whose messages do not taint a turn "
        "(with tools.taint.owners and the approvers). Never display names."))
    context_tokens: int = Field(128_000, ge=1024,
        description=("budget for prompt + transcript tail; also the context window of models "
                     "tidegate knows nothing about."))
    history_turns: int = Field(50, ge=0,
        description=("the model sees at most the newest 50 user turns (each with its replies and "
                     "tool calls) within that budget, behind the latest compaction summary; older "
                     "turns stay in the transcript and timeline. 0 = the whole context the budget "
                     "allows."))  # the model sees the newest N user turns; 0 = all
    max_tokens: int = Field(4096, ge=1,
        description=("max output tokens per model call (/think on Anthropic adds its thinking "
                     "budget: 1024/4096/16000)"))
    temperature: float | None = Field(
        None,
        description=("null = the provider's default; not sent to Anthropic while /think is on (the"
                     " API refuses it with thinking)"))
    max_tool_rounds: int = Field(40, ge=1,
        description="model calls per turn before the turn stops.")
    bootstrap_max_chars: int = Field(20_000, ge=0,
        description="cap per bootstrap file in the system prompt.")
    tools: ToolPolicy = Field(
        section(),
        description="tool policy layers 5 and 6 (see the top-level tools section)")
    subagents: SubagentSettings = Field(
        section(),
        description="limits of subagents started with sessions_spawn.")
    exec: ExecConfig = Field(
        section(),
        description="Limits of the exec tool.")
    sandbox: SandboxSettings = Field(
        section(),
        description="where exec commands run (the bubblewrap sandbox; see the exec page).")
    compaction: CompactionConfig = Field(
        section(),
        description="Summarising older messages when the context nears its budget.")
    heartbeat: HeartbeatConfig | None = Field(
        None,
        description="set (even to {}) to enable the heartbeat for agents; null = no heartbeat.")
    context_guard: ContextGuard = Field(
        section(),
        description="checked before every turn and by `tidegate config validate`.")
    tool_loop: ToolLoopConfig = Field(
        section(),
        description="the same tool + arguments + result in a row (or an A/B ping-pong)")

    @field_validator("user_timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return _check_tz(v)

    @field_validator("owners")
    @classmethod
    def _owners(cls, v: list[str]) -> list[str]:
        for item in v:
            if not str(item).strip() or str(item).strip() == "*":
                raise ValueError(f"owner {item!r} is not a sender id (give "
                                 "'<channel>:<user id>' or an identity-link name)")
        return [str(item).strip() for item in v]

    @property
    def model_primary(self) -> str | None:
        return self.model.primary if isinstance(self.model, ModelRef) else self.model

    @property
    def model_fallbacks(self) -> list[str]:
        return list(self.model.fallbacks) if isinstance(self.model, ModelRef) else []


class AgentEntry(ConfigModel):
    """An ``agents.list`` item: ``id`` plus any defaults key to override (checked on merge)."""

    model_config = ConfigDict(**{**ConfigModel.model_config, "extra": "allow"})
    id: str = Field(
        description="The agent id, used in session keys and on the command line.")

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        # Ids name directories (agents/<id>/, workspace/<id>/): no separators, no "..".
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", v or ""):
            raise ValueError("agent id must be 1-64 letters, digits, '-' or '_' "
                             "(it names directories)")
        return v.lower()

    def overrides(self) -> dict[str, Any]:
        """The entry's setting names in snake_case (camelCase aliases converted), ``id``
        included. Keys that are data, not setting names (``tools.by_provider`` model refs,
        ``tools.exec.env`` variable names), are kept as written."""
        return _field_keys(self.model_dump(by_alias=False), AgentSettings)


AgentList = list[AgentEntry]  # named outside: the field "list" shadows the builtin


class AgentsSection(ConfigModel):
    """``defaults`` is validated by :class:`AgentSettings` itself (``Lazy``), the model
    that :meth:`Config.agent` validates every merged agent with: built once, not twice."""

    defaults: Lazy[AgentSettings] = Field(
        section(),
        description="Settings every agent starts from; an agents.list entry overrides any of them.")
    list: AgentList = Field(
        [],
        description=("agents; each item: {id: <name>, ...any defaults key overridden}; empty = one"
                     " agent \"main\"."))

    @field_validator("list")
    @classmethod
    def _entries_valid(cls, entries: AgentList, info: ValidationInfo) -> AgentList:
        # A field validator, so it runs (on the built-in defaults) when ``defaults`` is
        # invalid too: every problem is reported at once.
        defaults = info.data.get("defaults") or section_defaults(AgentSettings)
        base = defaults.model_dump(by_alias=False)
        seen: set[str] = set()
        problems: list[str] = []
        for i, entry in enumerate(entries):
            if entry.id in seen:
                problems.append(f"{i}.id: duplicate agent id {entry.id!r}")
            seen.add(entry.id)
            try:
                AgentSettings.model_validate(_deep_merge(base, entry.overrides()))
            except ValidationError as exc:
                written = entry.model_dump(by_alias=False)  # extras keep the file's keys
                problems += [f"{i}.{_as_written(line, written)}"
                             for line in format_validation_error(exc, AgentSettings)]
        if problems:
            raise ValueError("\n".join(problems))
        return entries


def _as_written(line: str, written: dict[str, Any]) -> str:
    """A ``path: message`` line about a merged entry, its path spelled as the file spelled
    it (``contextTokens`` stays camelCase, like the errors of ``agents.defaults``)."""
    path, sep, msg = line.partition(": ")
    node: Any = written
    parts = []
    for part in path.split("."):
        key = part
        if isinstance(node, dict):
            key = next((k for k in node if isinstance(k, str) and to_snake(k) == part), part)
            node = node.get(key)
        parts.append(key)
    return ".".join(parts) + sep + msg


def _field_keys(value: Any, model: Any) -> Any:
    """``value`` with each key that names a field of ``model`` (by name, alias or camelCase
    spelling) turned into the field name, recursing along the fields' types. A mapping
    field's own keys are data (``gpt-4o``, ``MY_VAR``) and stay as written; an unknown key
    stays too, so validation names it as the file spells it."""
    if isinstance(value, list):
        return [_field_keys(v, model) for v in value]
    if not isinstance(value, dict) or model is None:
        return value
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return value
    names = {}
    for name, f in model.model_fields.items():
        names[name] = name
        if f.alias:
            names[f.alias] = name
    out: dict[Any, Any] = {}
    for k, v in value.items():
        name = names.get(k) or (names.get(to_snake(k)) if isinstance(k, str) else None)
        if name is None:
            out[k] = v
            continue
        annotation = model.model_fields[name].annotation
        out[name] = (_mapping_values(v, annotation) if _is_mapping(annotation)
                     else _field_keys(v, _inner_model(annotation)))
    return out


def _is_mapping(annotation: Any) -> bool:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return typing.get_origin(annotation) is dict or any(
        typing.get_origin(a) is dict for a in args)


def _mapping_values(value: Any, annotation: Any) -> Any:
    if not isinstance(value, dict):
        return value
    inner = _inner_model(annotation)
    return {k: _field_keys(v, inner) for k, v in value.items()}


def _inner_model(t: Any) -> Any:
    """The pydantic model inside ``X | None``, ``list[X]``, ``dict[str, X]``, ``Lazy[X]``."""
    if isinstance(t, type) and issubclass(t, BaseModel):
        return t
    for arg in typing.get_args(t):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out
