"""The configuration reference, walked from the pydantic schema (``gateway.config.schema``).

``config_keys()`` yields one :class:`ConfigKey` per key of config.yaml (dotted path,
``<name>`` for a mapping key, ``[]`` for a list item), in schema order; ``render()`` turns
them into the Markdown page ``docs/reference/configuration.md``. A model reached again at
a second path (a platform's ``accounts.<id>``) is not expanded twice: its entry says which
path has the same keys.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.config.reload import RESTART_ONLY
from gateway.config.schema import Config
from runtime.config_types import camel_alias, config_fields, parse_duration


@dataclass(frozen=True)
class ConfigKey:
    """One key: ``path`` (``channels.telegram.token``), the model class and field name
    that define it, ``type`` and ``default`` as rendered text, ``allowed`` (Literal
    choices or numeric bounds, text), ``reload`` (``live`` or ``restart``),
    ``description`` (the field's, empty when missing), ``same_as`` (the path whose keys
    this section repeats, or None)."""

    path: str
    model: type[BaseModel]
    field: str
    type: str
    default: str
    allowed: str
    reload: str
    description: str
    same_as: str | None = None


def _is_duration(info: FieldInfo) -> bool:
    return any(getattr(m, "func", None) is parse_duration for m in info.metadata)


def _models_in(t: Any) -> list[type[BaseModel]]:
    if isinstance(t, type) and issubclass(t, BaseModel):
        return [t]
    return [m for arg in typing.get_args(t) for m in _models_in(arg)]


def type_text(t: Any, duration: bool = False) -> str:
    """A short reader's name of annotation ``t``: ``str``, ``list[str]``, ``duration``,
    ``section`` (a nested model), ``one of ...`` is left to ``allowed``."""
    if duration:
        return "duration"
    origin = typing.get_origin(t)
    args = typing.get_args(t)
    if origin is typing.Annotated:
        inner = args[0]
        if any(getattr(m, "func", None) is parse_duration for m in args[1:]):
            return "duration"
        return type_text(inner)
    if origin is Literal:
        return "string" if all(isinstance(a, str) for a in args) else "literal"
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a) for a in args if a is not type(None)]
        text = " or ".join(dict.fromkeys(parts))
        return text + (" or null" if type(None) in args else "")
    if origin in (list, tuple, set):
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {type_text(args[1])}" if len(args) == 2 else "mapping"
    if isinstance(t, type) and issubclass(t, BaseModel):
        return "section"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        t, getattr(t, "__name__", str(t)))


def _literals(t: Any) -> list[Any]:
    if typing.get_origin(t) is Literal:
        return list(typing.get_args(t))
    return [v for a in typing.get_args(t) for v in _literals(a)]


def allowed_text(info: FieldInfo) -> str:
    """Literal choices (``a``, ``b``) or numeric bounds (``>= 1``) of a field, or ''."""
    choices = _literals(info.annotation)
    if choices:
        return ", ".join(f"`{'null' if c is None else c}`" for c in choices)
    bounds = []
    for m in info.metadata:
        for name, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(m, name, None)
            if value is not None:
                bounds.append(f"{sign} {value}")
        if getattr(m, "min_length", None) is not None:
            bounds.append(f"at least {m.min_length} long")
        if getattr(m, "max_length", None) is not None:
            bounds.append(f"at most {m.max_length} long")
    return ", ".join(bounds)


def _seconds(value: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    if value and value < 1:
        return f"{round(value * 1000)}ms"
    return f"{value:g}s" if value else "0"


def default_text(info: FieldInfo, duration: bool) -> str:
    """The default as it would be written in YAML; ``required`` when there is none."""
    if info.is_required():
        return "required"
    value = info.default
    if value is PydanticUndefined and info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    if duration and isinstance(value, (int, float)):
        return _seconds(float(value))
    if isinstance(value, dict) and not value and _models_in(info.annotation):
        return "(section)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value == "" or value.strip() != value else value
    return repr(value) if not isinstance(value, (list, dict)) else _yaml_flow(value)


def _yaml_flow(value: Any) -> str:
    import json
    return json.dumps(value, ensure_ascii=False)


def reload_of(path: str) -> str:
    """``restart`` when ``path`` is under a setting ``gateway.config.reload`` lists as
    restart-only, else ``live`` (applied by SIGHUP)."""
    for section, key in RESTART_ONLY:
        prefix = f"{section}.{key}" if key else section
        if path == prefix or path.startswith(prefix + "."):
            return "restart"
    return "live"


def config_keys(root: type[BaseModel] = Config) -> Iterator[ConfigKey]:
    """Every key of the schema under ``root``, depth first in declaration order."""
    seen: dict[type[BaseModel], str] = {}
    yield from _walk(root, "", seen)


def _walk(model: type[BaseModel], prefix: str,
          seen: dict[type[BaseModel], str]) -> Iterator[ConfigKey]:
    seen.setdefault(model, prefix)
    for field_name, info in config_fields(model, builtin_only=True).items():
        # a key spelt differently from its Python name (``global`` for ``global_``)
        name = info.alias if info.alias and info.alias != camel_alias(field_name) else field_name
        path = f"{prefix}{name}"
        duration = _is_duration(info)
        inner = _models_in(info.annotation)
        ann = info.annotation
        child = inner[0] if inner else None
        step = path
        origin = typing.get_origin(ann)
        if child is not None:
            dict_args = [a for a in [ann, *typing.get_args(ann)] if typing.get_origin(a) is dict]
            list_args = [a for a in [ann, *typing.get_args(ann)] if typing.get_origin(a) is list]
            if dict_args and _models_in(typing.get_args(dict_args[0])[1]):
                step = f"{path}.<name>"
            elif list_args and _models_in(typing.get_args(list_args[0])[0]):
                step = f"{path}[]"
        del origin
        same = None
        if child is not None:
            same = seen.get(child, next((where for m, where in seen.items()
                                         if m is not child and issubclass(m, child)), None))
        yield ConfigKey(path=path, model=model, field=field_name,
                        type=type_text(ann, duration), default=default_text(info, duration),
                        allowed=allowed_text(info), reload=reload_of(path),
                        description=(info.description or "").strip(),
                        same_as=(same.rstrip(".") or None) if same is not None else None)
        if child is not None and same is None:
            yield from _walk(child, step + ".", seen)


def _text(text: str) -> str:
    """Markdown text: ``<placeholders>`` shown as text (not HTML), one line."""
    return text.replace("\n", " ").replace("<", "&lt;")


def _code(text: str) -> str:
    """Text inside a code span (a default value), as it is."""
    return text.replace("`", "'")


def _sentence(text: str, choices: str) -> str:
    """A description as a sentence: a leading plain word is capitalised; one that is a
    value or a name (``debug | info``, ``xoxb-...``, ``null = ...``) is left as written."""
    listed = [c.strip("`") for c in choices.split(", ")] if choices.startswith("`") else []
    if listed and [w.strip() for w in text.rstrip(".").split("|")] == listed:
        return ""  # only the choices again, which the entry shows already
    if text and not text.endswith((".", "!", "?")):
        text += "."
    first = text.split(" ", 1)[0].rstrip(":;,")
    if not first.isalpha() or f"`{first}`" in choices or first in ("null", "true", "false"):
        return text
    return text[0].upper() + text[1:]


def render() -> str:
    """The Markdown of ``docs/reference/configuration.md``."""
    out = [
        "# Configuration reference",
        "",
        ("<!-- Generated by `python -m gateway.reference` from the config schema; "
        "do not edit by hand. -->"),
        "",
        ("Every key of `config.yaml`, generated from the schema the gateway validates "
        "with. **reload** says whether a changed value is applied by a reload (`live`: "
        "SIGHUP or `systemctl reload`) or needs a restart. Durations accept `30s`, `5m`, "
        "`1h`, `1d`, `250ms` or a number of seconds; `0` turns a feature off where noted. "
        "`<name>` stands for a key you choose (an account id, a provider name), `[]` for "
        "an item of a list. camelCase spellings of every key are accepted too. See "
        "[Configuration](../configuration.md) for how the file is read."),
        "",
    ]
    section = None
    for key in config_keys():
        top = key.path.split(".", 1)[0].removesuffix("[]")
        desc = _sentence(key.description, key.allowed)
        if key.same_as:
            desc = (desc + " " if desc else "") + f"Same keys as `{key.same_as}`."
        if top != section:
            section = top
            out += ["", f"## `{top}`", ""]
            if key.path == top:  # the section itself: its description leads
                out += [_text(desc) + f" Reload: {key.reload}.", ""]
                continue
        facts = [f"**{_text(key.type)}**", f"default `{_code(key.default)}`"]
        if key.allowed:
            facts.append(("one of " if key.allowed.startswith("`") else "")
                         + _text(key.allowed))
        facts.append(f"reload: {key.reload}")
        out += [f"`{key.path}`", f":   {', '.join(facts)}. {_text(desc)}".rstrip(), ""]
    return "\n".join(out).strip() + "\n"
