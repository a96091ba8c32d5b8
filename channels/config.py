"""Config models of the channel sections (``channels.*`` in config.yaml).

The pieces every chat platform shares live here: the access policy (:class:`AccessConfig`),
streaming and reply settings (:class:`LiveChatConfig`); ``channels/sections.py`` holds
:class:`PlatformSection` (per-account settings nest under ``accounts.<id>`` with the same
names; an account inherits every top-level key it does not set, see ``account_configs``). Each platform's
own model lives in its package (``channels/telegram/config.py``, ...) and is contributed
by its plugin (``channels/sdk.py``); :class:`ChannelsConfig` validates ``channels.<name>``
with it.
"""



from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from channels import registry
from channels.sections import PlatformSection, account_configs  # noqa: F401 - re-exported
from runtime.config_types import ConfigModel, Duration, Lazy, section, section_defaults
from runtime.tools.config import ToolRules


def _id_str(value: Any) -> Any:
    # YAML reads an unquoted Discord/Telegram id as an int; ids are strings everywhere.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


IdStr = Annotated[str, BeforeValidator(_id_str)]
DmPolicy = Literal["pairing", "allowlist", "open", "disabled"]
GroupPolicy = Literal["allowlist", "open", "disabled"]


class GroupSettings(ConfigModel):
    """``groups.<group_id>`` when ``groups`` is a mapping: the group is allowlisted and
    its ``tools`` narrow the tool set in it (tool policy layer 7); ``require_mention``
    overrides the account's rule there (``/activation`` overrides both at runtime);
    ``system_prompt`` is added to the prompt of turns in that group (quoted as operator
    text under "# Chat"); ``dm_scope`` (one of ``session.dm_scope``'s values) puts each
    sender's messages in that group into the sender's DM session under that scope instead
    of the group's shared session (``main``: the agent's main session), replies still
    going to the group."""

    tools: ToolRules = Field(
        section(),
        description="Tool policy layer 7 for this group.")
    require_mention: bool | None = Field(
        None,
        description=("Override of the account's require_mention in this group; null = the "
                     "account's."))
    system_prompt: str | None = Field(
        None,
        description="Operator instructions added to the prompt of this group's turns.")
    dm_scope: Literal["main", "per-peer", "per-channel-peer",
                      "per-account-channel-peer"] | None = Field(
        None,
        description=("null = one shared group session; else each sender's messages join that "
                     "sender's DM session under this scope (replies still go to the group)."))


class DmSettings(ConfigModel):
    """``dm``: settings of direct messages; ``tools`` is tool policy layer 7 for DMs."""

    tools: ToolRules = Field(
        section(),
        description="tool policy layer 7 for direct messages.")


class AccessConfig(ConfigModel):
    """Access policy shared by all platforms (enforced before any model call).

    ``groups`` is a list of allowlisted group ids, or a mapping group id -> settings
    (the keys are the allowlist)."""

    dm_policy: DmPolicy = Field(
        "pairing",
        description="pairing | allowlist | open | disabled.")
    allow_from: list[IdStr] = Field(
        [],
        description="user ids or usernames (\"*\" = everyone)")
    group_policy: GroupPolicy = Field(
        "allowlist",
        description="allowlist | open | disabled.")
    groups: list[IdStr] | dict[IdStr, GroupSettings] = Field(
        [],
        description=("allowed group/chat ids (\"*\" = all); or a mapping with per-group tool policy "
                     "(layer 7)."))
    dm: DmSettings = Field(
        section(),
        description="Settings of direct messages.")
    require_mention: bool = Field(
        True,
        description="in groups, answer only when mentioned or replied to.")
    allow_bots: bool = Field(
        False,
        description="Whether messages from other bots may start turns.")
    debounce: Duration = Field(
        0.0,
        description=("idle-session burst merging (see webchat.debounce); 0 = a message starts its "
                     "turn at once."))  # idle-session burst merging (seconds; 0 = start at once)


StreamMode = Literal["off", "partial", "block"]
ReplyToMode = Literal["off", "first", "all"]


def _streaming_shorthand(value: Any) -> Any:
    # ``streaming: partial`` is short for ``streaming: {mode: partial}``; false means off.
    if isinstance(value, str):
        return {"mode": value}
    if value is False:
        return {"mode": "off"}
    return value


class StreamingConfig(ConfigModel):
    """``channels.<p>.streaming``: ``mode`` off|partial|block (None: partial in DMs, block
    in groups); ``min_interval`` seconds between edits of one streamed reply (None: the
    platform's default, channels/outbound/streaming.py ``DEFAULT_MIN_INTERVAL``)."""

    mode: StreamMode | None = Field(
        None,
        description=("off | partial (one message grows) | block (one message per paragraph); null "
                     "= partial in DMs, block in groups."))
    min_interval: Duration | None = Field(
        None,
        description="Least time between two updates of one streamed reply; null = 1s.")


class LiveChatConfig(ConfigModel):
    """Issue 13 settings shared by the chat platforms: streamed replies, quoting of the
    triggering message (``reply_to_mode``) and the group context kept for the next
    mentioned turn (``group_history``, channels/inbound/group_history.py)."""

    streaming: Annotated[StreamingConfig, BeforeValidator(_streaming_shorthand)] = Field(
        section(),
        description=("off | partial | block (null: partial in DMs, block in groups); min_interval "
                     "null = 1s."))
    reply_to_mode: ReplyToMode = Field(
        "first",
        description=("quote the triggering message on: off (no part) | first (first part) | all "
                     "(every part)"))
    group_history: int = Field(30, ge=0,
        description=("unmentioned messages of an allowed group kept (in memory, <= 6000 chars) for"
                     " the next mentioned turn; 0 = off."))  # unmentioned group messages kept as context
    tool_progress: bool = Field(
        False,
        description=("default of /verbose: a \"🔧 read notes.md\" status line edited in place while "
                     "tools run."))  # default of /verbose: a "🔧 read notes.md" status line


class WebchatConfig(ConfigModel):
    enabled: bool = Field(
        True,
        description="chat page at http://127.0.0.1:<port>/ (tidegate dashboard prints the URL)")
    dm_policy: DmPolicy = Field(
        "open",
        description="Who may chat through the page (it already needs the gateway token).")
    debounce: Duration = Field(
        0.0,
        description=("idle-session burst merging on this channel: messages within this long of "
                     "each other share one turn (0 = start at once)"))


class OpenAIApiConfig(ConfigModel):
    """The OpenAI-compatible ``/v1/chat/completions`` endpoint on the gateway."""

    enabled: bool = Field(
        True,
        description="POST /v1/chat/completions and GET /v1/models (bearer token)")
    debounce: Duration = Field(
        0.0,
        description=("Idle-session burst merging on this endpoint (0 = a request starts its turn "
                     "at once)."))


LOCAL_SECTIONS = ("webchat", "openai_api", "openaiApi")


class ChannelsConfig(ConfigModel):
    """``channels``: the two local channels (fixed keys) and one section per chat platform
    plugin (``channels.<name>``, validated with the plugin's own config model,
    ``channels/sdk.py`` ``ChannelPlugin.config``; errors name ``channels.<name>.<key>``).
    A platform the file leaves out reads as its model's defaults (disabled); a key that
    names no installed plugin is an error listing the installed ones."""

    model_config = ConfigDict(**{**ConfigModel.model_config, "extra": "allow"})

    webchat: Lazy[WebchatConfig] = Field(
        section(),
        description="The control UI's chat page and its WebSocket.")
    openai_api: Lazy[OpenAIApiConfig] = Field(
        section(),
        description="The OpenAI-compatible endpoint for any OpenAI client.")
    # the defaults of platforms the file leaves out, made on first use (per config)
    _defaults: dict[str, Any] = PrivateAttr({})

    @model_validator(mode="wrap")
    @classmethod
    def _platform_sections(cls, data: Any, handler: Any) -> Any:
        if not isinstance(data, dict):
            return handler(data)
        model = handler({k: v for k, v in data.items() if k in LOCAL_SECTIONS})
        sections, errors = {}, []
        for name, value in data.items():
            if name in LOCAL_SECTIONS:
                continue
            try:
                made = _validate_platform(str(name), value)
            except ValidationError as exc:
                errors += [{"type": e["type"], "loc": (name, *e["loc"]), "input": e["input"],
                            **({"ctx": e["ctx"]} if "ctx" in e else {})}
                           for e in exc.errors()]
                continue
            if made is not None:
                sections[name] = made
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        if model.__pydantic_extra__ is None:
            model.__pydantic_extra__ = {}
        model.__pydantic_extra__.update(sections)
        return model

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return super().__getattr__(name)
        extra = self.__pydantic_extra__ or {}
        if name in extra:
            return extra[name]
        made = self._defaults.get(name)
        if made is None:
            model = registry.config_model(name)
            if model is None:
                raise AttributeError(f"no channel section {name!r}")
            made = self._defaults[name] = section_defaults(model)
        return made

    def __eq__(self, other: object) -> bool:
        # the made-on-use defaults (``_defaults``) are a cache, not config: a reload
        # comparing two configs must not see a change in them
        if not isinstance(other, ChannelsConfig):
            return NotImplemented
        return (self.__dict__ == other.__dict__
                and (self.__pydantic_extra__ or {}) == (other.__pydantic_extra__ or {}))

    __hash__ = None  # type: ignore[assignment]  # like every pydantic model

    def platform(self, name: str) -> Any:
        """The section of chat platform ``name``: validated, its defaults when the file
        leaves it out, or None when no loaded plugin has that name (or ``name`` is None)."""
        return getattr(self, name, None) if isinstance(name, str) and name else None

    def platforms(self) -> dict[str, Any]:
        """``{name: section}`` of every loaded chat platform plugin, built-ins first."""
        return {name: getattr(self, name) for name in registry.channel_names()}

    @classmethod
    def config_sections(cls, builtin_only: bool = False) -> dict[str, Any]:
        """``{name: FieldInfo}`` of the platform sections (for the reference docs and
        error suggestions), in plugin order."""
        from pydantic.fields import FieldInfo
        return {name: FieldInfo(annotation=plugin.config, default={},
                                description=plugin.description or None)
                for name, plugin in registry.channel_plugins(builtin_only).items()}


def _validate_platform(name: str, value: Any) -> Any:
    """``channels.<name>`` validated by its plugin's model; None for a plugin that failed
    to load (it is reported by the plugin loader and not started). Raises ValidationError
    with paths relative to the section (a name no plugin has: one error on the section)."""
    model, problem = registry.config_model_or_problem(name)
    if problem is not None:
        raise ValidationError.from_exception_data("channels", [{
            "type": "value_error", "loc": (), "input": value,
            "ctx": {"error": ValueError(problem)}}])
    if model is None:
        return None
    try:
        if value is None or (type(value) is dict and not value):
            return section_defaults(model)
        return model.model_validate(value)
    except (ValidationError, RecursionError):
        raise
    except Exception as exc:  # noqa: BLE001 - a plugin's broken model: one line, no traceback
        raise ValidationError.from_exception_data("channels", [{
            "type": "value_error", "loc": (), "input": value,
            "ctx": {"error": ValueError(model_failure(name, exc))}}]) from None


def model_failure(name: str, exc: BaseException) -> str:
    """The problem line of a plugin config model that raised ``exc`` while validating."""
    return (f"the config model of channel plugin {name!r} is broken "
            f"({type(exc).__name__}: {exc}); `tidegate plugins doctor` checks it")


def check_config_model(name: str, model: Any) -> str | None:
    """Validate an empty and an enabled ``channels.<name>`` with the plugin's ``model``:
    None when both validate or fail with ordinary key errors (a required key), else the
    :func:`model_failure` line (a validator that raises TypeError, ...)."""
    for probe in ({}, {"enabled": True}):
        try:
            model.model_validate(probe)
        except ValidationError:
            continue
        except Exception as exc:  # noqa: BLE001 - what the check is for
            return model_failure(name, exc)
    return None


_SECTION_OF_CHANNEL = {"openai": "openai_api"}


def channel_debounce(channels: ChannelsConfig, channel: str, account: str = "default") -> float:
    """``channels.<channel>[.accounts.<account>].debounce`` in seconds (0 for channels
    without a section, e.g. the CLI): how long a message to an IDLE session waits for more
    messages of a burst before its turn starts. Busy sessions follow ``messages.queue``."""
    section = getattr(channels, _SECTION_OF_CHANNEL.get(channel, channel), None)
    if section is None:
        return 0.0
    accounts = getattr(section, "accounts", None)
    if accounts and account in accounts:
        section = accounts[account]
    return float(getattr(section, "debounce", 0.0) or 0.0)
