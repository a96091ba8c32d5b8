"""``SKILL.md`` front matter (seed 001 §7): a leading YAML block between ``---`` lines.

Keys: ``name`` (required), ``description``, ``always`` (inline the body in the prompt),
``requires: {bins: [...], env: [...], os: [...]}`` (also accepted under
``metadata.openclaw.requires``, where OpenClaw skills keep it).
"""

from __future__ import annotations

from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available


class SkillFormatError(ValueError):
    """The front matter is missing or malformed; the message says what is wrong."""


def split_front_matter(text: str) -> tuple[str, str]:
    """``(yaml_text, body)``. Raises SkillFormatError without a closed ``---`` block."""
    if not text.startswith("---"):
        raise SkillFormatError("no front matter (the file must start with ---)")
    end = text.find("\n---", 3)
    if end < 0:
        raise SkillFormatError("front matter is not closed by a --- line")
    after = text.find("\n", end + 4)
    return text[3:end], (text[after + 1:] if after >= 0 else "")


def parse_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """``(metadata, body)`` of a SKILL.md text. Raises SkillFormatError for bad YAML, a
    non-mapping, or a missing/empty ``name``."""
    head, body = split_front_matter(text)
    try:
        meta = yaml.load(head, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise SkillFormatError(f"front matter is not valid YAML: {exc}".splitlines()[0]) \
            from None
    if not isinstance(meta, dict):
        raise SkillFormatError("front matter must be a YAML mapping")
    name = meta.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SkillFormatError("front matter has no name")
    desc = meta.get("description", "")
    if not isinstance(desc, str):
        raise SkillFormatError("description must be a string")
    return meta, body


def requirements(meta: dict[str, Any]) -> dict[str, list[str]]:
    """``{"bins": [...], "env": [...], "os": [...]}`` from ``requires`` (or
    ``metadata.openclaw.requires``); entries that are not strings are ignored."""
    req = meta.get("requires")
    if req is None:
        nested = (meta.get("metadata") or {}) if isinstance(meta.get("metadata"), dict) else {}
        req = (nested.get("openclaw") or {}).get("requires") if isinstance(
            nested.get("openclaw"), dict) else None
    if not isinstance(req, dict):
        return {"bins": [], "env": [], "os": []}
    out = {}
    for key in ("bins", "env", "os"):
        value = req.get(key) or []
        value = [value] if isinstance(value, str) else value
        out[key] = [str(v) for v in value if isinstance(v, (str, int))] \
            if isinstance(value, list) else []
    return out
