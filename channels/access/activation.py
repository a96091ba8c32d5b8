"""``/activation mention|always`` (issue 13 "Group context and activation"): a group's
runtime choice of whether the bot needs a mention there, kept in
``<state_dir>/channels/activation.json`` so it survives a restart::

    {"telegram:default:-1001234567890": "always", "slack:default:C0GENERAL": "mention"}

It overrides ``channels.<p>.groups.<id>.require_mention`` and ``require_mention``
(channels/access/policy.py ``mention_required``). Writes are atomic (temp file + rename). A
corrupt file disables only this store: it is renamed ``.corrupt``, logged, and the groups
fall back to their configured rule.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

MODES = ("mention", "always")


class ActivationStore:
    """Per-group activation modes (``mention`` | ``always``) on disk."""

    def __init__(self, path: Path, problems: list[str] | None = None) -> None:
        self.path = path
        self._modes: dict[str, str] = {}
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
            self._modes = {str(k): v for k, v in raw.items() if v in MODES}
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            path.rename(path.with_name(path.name + ".corrupt"))
            log.error("state_file_corrupt", owner="group activation", path=str(path),
                      error=str(exc), effect="groups use their configured require_mention",
                      fix="the bytes are kept in activation.json.corrupt")
            if problems is not None:
                problems.append(f"group activation file was corrupt: {path}")

    @staticmethod
    def key(channel: str, account: str, group_id: str) -> str:
        return f"{channel}:{account}:{group_id}"

    def get(self, channel: str, account: str, group_id: str | None) -> str | None:
        """The group's mode, or None when none was set."""
        return self._modes.get(self.key(channel, account, group_id)) if group_id else None

    def set(self, channel: str, account: str, group_id: str, mode: str) -> None:
        """Set ``mode`` (one of MODES) and write the file. Raises OSError."""
        if mode not in MODES:
            raise ValueError(f"activation must be one of {MODES}, not {mode!r}")
        self._modes[self.key(channel, account, group_id)] = mode
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self._modes, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path)
