"""The turn's text of a webhook: ``message_template`` with ``{{dotted.path}}``
placeholders filled from the JSON body (``gateway/config/hooks.py``)."""

from __future__ import annotations

import json
import re
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([^{}\s]+)\s*\}\}")
MAX_VALUE = 4000  # characters of one filled-in value (a whole body is cut there)


def lookup(body: Any, path: str) -> Any:
    """The value at ``path`` (``a.b.0.c``) in ``body``, or None when it is not there."""
    value = body
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE] + " …(cut)"


def render(template: str, body: Any, *, hook: str, event: str | None = None) -> str:
    """``template`` filled in: ``{{.}}`` the body as JSON, ``{{hook}}`` and ``{{event}}``
    the hook's name and event header, any other ``{{path}}`` that field of the body
    (missing: empty). Never raises for a body's shape."""
    def fill(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == ".":
            return _text(body)
        if key == "hook":
            return hook
        if key == "event":
            return event or ""
        return _text(lookup(body, key))
    return _PLACEHOLDER.sub(fill, template).strip()
