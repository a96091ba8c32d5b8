"""A session entry (session key -> id, times, last route, counters, choices), its reset
policy (issue 2 §5: ``none`` | ``daily`` at ``at_hour`` in the user's timezone | ``idle``
after ``idle_minutes``; only user activity counts) and its two JSON forms: ours
(``sessions.json`` version 1, RFC 3339 UTC times) and OpenClaw's (camelCase, epoch ms).
The store that keeps entries: gateway/sessions/store.py.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from pydantic.alias_generators import to_camel

from runtime.clock import parse_iso, utc_iso

_CAMEL = {n: to_camel(n) for n in ("created_at", "updated_at", "last_active_at")}


@dataclass(slots=True)
class SessionEntry:
    """One session. Times are epoch seconds in memory, RFC 3339 strings on disk."""

    session_key: str
    session_id: str
    agent: str
    created_at: float
    updated_at: float
    last_active_at: float | None = None
    last_route: dict[str, Any] | None = None
    counters: dict[str, int] = field(default_factory=dict)
    chat_type: str | None = None
    display_name: str | None = None
    model_override: str | None = None  # /model <ref> (gateway/turns/commands.py)
    verbose: bool | None = None  # /verbose on|off (None: channels.<p>.tool_progress)
    think: str | None = None  # /think low|medium|high (None: off)

    def to_json(self) -> dict[str, Any]:
        last = self.last_active_at
        return {"session_key": self.session_key, "session_id": self.session_id,
                "agent": self.agent, "created_at": utc_iso(self.created_at),
                "updated_at": utc_iso(self.updated_at),
                "last_active_at": utc_iso(last) if last is not None else None,
                "last_route": self.last_route, "counters": dict(self.counters),
                "chat_type": self.chat_type, "display_name": self.display_name,
                "model_override": self.model_override, "verbose": self.verbose,
                "think": self.think}

    @classmethod
    def from_json(cls, key: str, d: dict[str, Any], agent: str, now: float) -> SessionEntry:
        """Tolerant load: missing times are filled (seed 002: old files still load)."""

        def t(name: str, default: float | None) -> float | None:
            v = d[name] if name in d else d.get(_CAMEL[name])
            if isinstance(v, (int, float)):
                return float(v) / (1000.0 if v > 1e11 else 1.0)
            if isinstance(v, str):
                try:
                    return parse_iso(v)
                except ValueError:
                    return default
            return default

        updated = t("updated_at", None)
        created = t("created_at", updated if updated is not None else now) or now
        updated = updated if updated is not None else created
        return cls(
            session_key=key,
            session_id=str(d.get("session_id") or d.get("sessionId") or uuid.uuid4()),
            agent=str(d.get("agent") or agent),
            created_at=created,
            updated_at=updated,
            # Missing (an old file): filled from updated_at; an explicit null stays null
            # (a session that only ever had heartbeat/cron turns).
            last_active_at=t("last_active_at", None if any(
                k in d for k in ("last_active_at", "lastActiveAt")) else updated),
            last_route=d.get("last_route") or d.get("lastRoute"),
            counters={k: int(v) for k, v in (d.get("counters") or {}).items()
                      if isinstance(v, (int, float))},
            chat_type=d.get("chat_type"),
            display_name=d.get("display_name"),
            model_override=d.get("model_override") if isinstance(
                d.get("model_override"), str) else None,
            verbose=d.get("verbose") if isinstance(d.get("verbose"), bool) else None,
            think=d.get("think") if d.get("think") in ("low", "medium", "high") else None,
        )


def new_session_id() -> str:
    return str(uuid.uuid4())


def reset_due(entry: SessionEntry, *, mode: str, now: float, at_hour: int = 4,
              idle_minutes: int = 60, tz: str = "UTC") -> str | None:
    """Why ``entry`` must roll to a new session before a user turn at ``now``, or None.

    ``daily``: the last user activity is before the most recent ``at_hour:00`` in ``tz``.
    ``idle``: more than ``idle_minutes`` since the last user activity.
    """
    last = entry.last_active_at if entry.last_active_at is not None else entry.updated_at
    if mode == "idle":
        return "idle" if now - last > idle_minutes * 60 else None
    if mode == "daily":
        zone = ZoneInfo(tz)
        local_now = datetime.fromtimestamp(now, zone)
        boundary = local_now.replace(hour=at_hour, minute=0, second=0, microsecond=0)
        if boundary > local_now:
            boundary -= timedelta(days=1)
        # Re-localise after the day arithmetic so DST days get the right offset.
        boundary = boundary.replace(tzinfo=None).replace(tzinfo=zone)
        return "daily" if last < boundary.timestamp() else None
    return None


def openclaw_entry(entry: SessionEntry) -> dict[str, Any]:
    """One entry in OpenClaw's ``sessions.json`` form (camelCase, times in epoch ms)."""
    route = entry.last_route or {}
    c = entry.counters
    out: dict[str, Any] = {
        "sessionId": entry.session_id, "updatedAt": int(entry.updated_at * 1000),
        "createdAt": int(entry.created_at * 1000),
        "sessionFile": f"{entry.session_id}.jsonl",
        "chatType": entry.chat_type, "displayName": entry.display_name,
        "lastChannel": route.get("channel"), "lastTo": route.get("to"),
        "lastAccountId": route.get("account"), "lastThreadId": route.get("thread"),
        "inputTokens": c.get("input_tokens", 0), "outputTokens": c.get("output_tokens", 0),
        "totalTokens": c.get("input_tokens", 0) + c.get("output_tokens", 0),
    }
    return {k: v for k, v in out.items() if v is not None}


def read_sessions_file(path: Path, agent: str, now: float) -> dict[str, SessionEntry]:
    """Parse a sessions.json (OpenClaw's flat ``{key: entry}`` form is accepted too)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); "
                         f"fix or move the file aside") from None
    sessions = data.get("sessions", data) if isinstance(data, dict) else {}
    out: dict[str, SessionEntry] = {}
    for key, entry in sessions.items():
        if isinstance(entry, dict) and key != "version":
            out[key] = SessionEntry.from_json(key, entry, agent, now)
    return out
