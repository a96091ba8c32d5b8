"""Config building blocks shared by every package's config section.

``ConfigModel`` is the base of all config models: unknown keys are errors, OpenClaw-style
camelCase keys are accepted as aliases of the snake_case names. ``Lazy[Section]`` marks a
section validated by its own model, built only when a config has it. ``Duration`` accepts
``30s``, ``5m``, ``1h``, ``1d``, ``250ms``, ``1h30m``, plain numbers (seconds) and ``0`` (off),
and validates to float seconds.
"""


import re
import typing
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel, to_snake
from pydantic_core import core_schema

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# Values at such paths are never echoed in error messages (they may be secrets).
_SECRETISH = re.compile(r"token|secret|passw|key|auth|header|credential|dsn", re.IGNORECASE)
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: Any) -> float:
    """Parse a duration into seconds.

    Accepts int/float seconds, or strings like ``"30s"``, ``"5m"``, ``"1h30m"``, ``"0"``.
    Raises ValueError with the expected forms on anything else (booleans included).
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration like 30s, 5m, 1h or 0")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("duration must not be negative")
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return float(text)
        pos, total = 0, 0.0
        for m in _PART.finditer(text):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            pos = m.end()
        if text and pos == len(text):
            return total
    raise ValueError(f"expected a duration like 30s, 5m, 1h or 0, got {value!r}")


Duration = Annotated[float, BeforeValidator(parse_duration)]


_PLAIN_SNAKE = re.compile(r"[a-z]+(?:_[a-z]+)*")


def camel_alias(name: str) -> str:
    """pydantic's ``to_camel`` (``api_base_url`` -> ``apiBaseUrl``), without its three
    regular expressions for the plain lower-case snake names that all but a few fields
    have; anything else goes to ``to_camel`` itself. Every field's alias is generated when
    its class is created, ~430 at every start (tests/test_config_build.py proves the two
    agree on every field)."""
    if _PLAIN_SNAKE.fullmatch(name):
        first, *rest = name.split("_")
        return first + "".join(word.capitalize() for word in rest)
    return to_camel(name)


class ConfigModel(BaseModel):
    """Base for config sections: forbid unknown keys, accept camelCase aliases.

    Fields default to ``[]``, ``{}`` and ``section()`` rather than ``default_factory``:
    pydantic copies mutable defaults per instance, while a factory has its signature
    inspected when the class is built (~0.5 ms for ``list``, 110 fields at every start).

    ``defer_build``: a model's validator and serializer are built the first time it
    validates or dumps, not when its module is imported; with :data:`Lazy` sections that
    is only for the sections a config file has (issue 9, cold start).
    """

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=camel_alias,
        populate_by_name=True,
        validate_default=True,
        defer_build=True,
        protected_namespaces=(),  # no field starts with model_; skips a check per field
    )


def section(**given: Any) -> Any:
    """The default of a nested config section: absent, it validates as ``{}`` (or as the
    ``given`` keys).

    ``ConfigModel`` validates defaults, so the section gets its own model's defaults, as if
    the file said ``name: {}``; pydantic copies a mutable default for each instance.
    """
    return dict(given)


def section_defaults(model: type[BaseModel], given: dict[str, Any] | None = None) -> Any:
    """What ``model.model_validate(given or {})`` returns, without validating: every field
    at its default, nested ``section()`` fields likewise. Defaults are valid by
    construction, and building the model's validator costs ~1-5 ms per section, so a
    section a config leaves out is made this way (tests/test_config_build.py checks the
    result equals validation, ``model_fields_set`` included, for every section)."""
    made = model.model_construct(_fields_set=set(given or ()), **(given or {}))
    for name, field in model.model_fields.items():
        if name not in made.__dict__:
            continue  # a required field (a plugin's, say): the section is not configured
        value = made.__dict__[name]
        inner = field.annotation
        if type(value) is dict and isinstance(inner, type) and issubclass(inner, BaseModel):
            made.__dict__[name] = section_defaults(inner, value)
    return made


class _ValidatedOnUse:
    """Schema of a :data:`Lazy` field: a function that validates with the section model's
    own validator. The enclosing model's schema thus stops at the field, and the section's
    validator is built (``defer_build``) the first time a config has the section."""

    def __get_pydantic_core_schema__(self, model: Any, handler: Any) -> Any:
        def validate(value: Any) -> Any:
            if type(value) is dict and not value:  # left out (or ``{}``): the defaults
                return section_defaults(model)
            return model.model_validate(value)

        # pydantic-core re-roots the ValidationError raised inside at this field's path,
        # so errors still name ``channels.telegram.token``; dumps use the value's own
        # serializer (the schema's ``any`` serialization infers it).
        return core_schema.no_info_plain_validator_function(validate)


_Section = TypeVar("_Section")
# ``telegram: Lazy[TelegramChannelConfig] = section()``: the field's annotation stays the
# model class (``model_fields``, ``_model_at`` and the docs tests see it), its value the
# same validated model, but the model is only built when a config has the section.
Lazy = Annotated[_Section, _ValidatedOnUse()]


def config_fields(model: type[BaseModel], builtin_only: bool = False) -> dict[str, Any]:
    """``model.model_fields`` plus the sections a model adds at run time
    (``config_sections()``: the channel plugins' ``channels.<name>``), as FieldInfo."""
    extra = getattr(model, "config_sections", None)
    if extra is None:
        return dict(model.model_fields)
    return {**model.model_fields, **extra(builtin_only)}


def _inner(t: Any) -> Any:
    """The config model inside ``X | None``, ``list[X]`` or ``dict[str, X]`` (else None)."""
    if isinstance(t, type) and issubclass(t, BaseModel):
        return t
    for arg in typing.get_args(t):
        found = _inner(arg)
        if found is not None:
            return found
    return None


def _model_at(root: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    """The config model class that ``loc`` (a dotted path's parts) points into, or None.
    List indexes and mapping keys step into the element model."""
    current: type[BaseModel] | None = root
    for part in loc:
        if current is None:
            return None
        field = next((f for n, f in config_fields(current).items()
                      if part in (n, f.alias)), None)
        if field is not None:
            current = _inner(field.annotation)
        # else: an index or a mapping key; ``current`` is already the element's model
    return current


def _did_you_mean(root: type[BaseModel] | None, loc: list[str]) -> str:
    if root is None or not loc:
        return ""
    model = _model_at(root, loc[:-1])
    if model is None:
        return ""
    names = list(config_fields(model))
    import difflib  # only for a bad key's suggestion
    close = difflib.get_close_matches(to_snake(loc[-1]), names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def format_validation_error(exc: ValidationError,
                            root: type[BaseModel] | None = None) -> list[str]:
    """Turn pydantic errors into ``dotted.path: message`` lines. With the ``root`` model,
    an unknown key gets ``(did you mean 'port'?)`` when a known key is close."""
    out: list[str] = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"] if not str(p).startswith("function-")]
        # Union members appear in loc as type names; drop them for a readable path.
        loc = [p for p in loc if not re.fullmatch(r"(str|int|float|bool|list\[.*\]|"
                                                   r"dict\[.*\]|[A-Z]\w+)", p)]
        msg = err["msg"]
        kind = err["type"]
        if kind == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(root, loc)
        elif kind == "missing":
            msg = "required"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        elif msg.startswith("Assertion failed, "):
            msg = msg[len("Assertion failed, "):]
        base = ".".join(loc)
        for line in msg.split("\n"):
            m = re.match(r"^(\w[\w.]*): (.+)$", line)  # "0.id: ..." from a list check
            if m and kind == "value_error":
                out.append(f"{base}.{m.group(1)}: {m.group(2)}" if base else line)
            else:
                got = err.get("input")
                shown = ""
                if (kind not in ("extra_forbidden", "missing", "value_error")
                        and not isinstance(got, (dict, list)) and not _SECRETISH.search(base)):
                    shown = f" (got {got!r})"
                out.append(f"{base or '<root>'}: {line}{shown}")
    return sorted(dict.fromkeys(out), key=out.index)
