"""Turn-by-turn playback of a timeline, for people (seed 000 §4.2 "replay the decision
process"; issue 5 ``tidegate timeline replay``).

:func:`replay_turns` groups a session's events into turns — the input (user message or a
heartbeat/cron/system prompt), each model output with its model time, every tool call with
its arguments and every result with its duration, until the model answers without tools —
and renders them with local timestamps (the user's timezone) and offsets from the start of
the turn. Events outside turns (session start/end, system events, heartbeat outcomes, cron
runs, compactions) are single lines between the turns. Pure function; no I/O.
``runtime.timeline.export.replay_lines`` is the one-line-per-event variant.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from runtime.clock import format_elapsed
from runtime.timeline.export import describe_event
from runtime.timeline.model import TimelineEvent

_TURN_TYPES = frozenset({"USER_INPUT", "LLM_RESPONSE", "TOOL_CALL", "TOOL_RESULT"})
_INDENT = " " * 25  # under the step description
_CAP = 2000  # characters of one text block unless ``full``
_END_OF_TURN_RESULT = ("error: the turn timed out", "error: the turn was aborted")


def _dur(ms: float) -> str:
    """``850ms`` / ``1.25s`` / ``3m 5s`` (durations inside a turn)."""
    if ms < 1000:
        return f"{int(ms)}ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f}s"
    return format_elapsed(ms / 1000)


def _block(text: Any, full: bool) -> list[str]:
    s = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    if not full and len(s) > _CAP:
        s = s[:_CAP] + f"… [{len(s) - _CAP} more characters; --full shows all]"
    return [_INDENT + line for line in (s.splitlines() or [""])]


def _args(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


class _Renderer:
    def __init__(self, zone: tzinfo, full: bool) -> None:
        self.zone, self.full = zone, full

    def stamp(self, ms: int, date: bool = True) -> str:
        local = datetime.fromtimestamp(ms / 1000, tz=self.zone)
        fmt = "%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S"
        out = local.strftime(fmt) + f".{ms % 1000:03d}"
        return out + " " + local.strftime("%Z") if date else out

    def single(self, ev: TimelineEvent) -> list[str]:
        c = ev.content if isinstance(ev.content, dict) else {}
        text = describe_event(ev.event_type, c)
        return [f"{self.stamp(ev.timestamp)}  {ev.event_type:<14} {text}"]

    def turn(self, number: int, events: list[TimelineEvent]) -> list[str]:
        start = events[0].timestamp
        first = events[0].content if events[0].event_type == "USER_INPUT" else {}
        trigger = first.get("trigger") or "user"
        models = [e for e in events if e.event_type == "LLM_RESPONSE"]
        results = [e for e in events if e.event_type == "TOOL_RESULT"]
        model_ms = sum(float(e.content.get("model_ms") or 0) for e in models)
        tool_ms = sum(float(e.content.get("duration_ms") or 0) for e in results)
        took = _dur(events[-1].timestamp - start)
        head = (f"Turn {number} ({trigger}) — {self.stamp(start)}, took {took}; "
                f"{len(models)} model call{'s' * (len(models) != 1)}")
        if model_ms:
            head += f" ({_dur(model_ms)})"
        head += f", {len(results)} tool call{'s' * (len(results) != 1)}"
        if results:
            head += f" ({_dur(tool_ms)})"
        lines = ["", head]
        for ev in events:
            lines += self.step(ev, start)
        return lines + [""]

    def step(self, ev: TimelineEvent, start: int) -> list[str]:
        c = ev.content if isinstance(ev.content, dict) else {}
        at = f"  {self.stamp(ev.timestamp, date=False)} +{_dur(ev.timestamp - start):<8} "
        t = ev.event_type
        if t == "USER_INPUT":
            who = c.get("trigger") and f"{c['trigger']} prompt" or "user"
            if c.get("sender"):
                who += f" [{c['sender']}]"
            return [at + who + ":"] + _block(c.get("text", ""), self.full)
        if t == "LLM_RESPONSE":
            model = "/".join(x for x in (c.get("provider"), c.get("model")) if x) or "model"
            took = f", model {_dur(float(c['model_ms']))}" if c.get("model_ms") is not None else ""
            usage = c.get("usage") or {}
            tokens = (f", {usage.get('input', 0)} in / {usage.get('output', 0)} out tokens"
                      if usage else "")
            calls = c.get("tool_calls") or []
            what = f" → calls {', '.join(str(x.get('name')) for x in calls)}" if calls else ""
            out = [at + f"assistant ({model}{took}{tokens}){what}" + (":" if c.get("text")
                                                                         else "")]
            return out + (_block(c["text"], self.full) if c.get("text") else [])
        if t == "TOOL_CALL":
            return [at + f"tool call {c.get('name', '?')} [{c.get('id', '')}]"] + \
                _block(_args(c.get("arguments", {})), self.full)
        if t == "TOOL_RESULT":
            flag = "ERROR" if c.get("is_error") else "ok"
            took = f", {_dur(float(c['duration_ms']))}" if "duration_ms" in c else ""
            return [at + f"tool result {c.get('name', '?')} {flag}{took}:"] + \
                _block(c.get("result", ""), self.full)
        return [at + f"{t}: {describe_event(t, c)}"]


def replay_turns(events: Iterable[TimelineEvent], tz: str | tzinfo = "UTC", *,
                 full: bool = False) -> list[str]:
    """Readable playback of a session's events (in seq order), grouped into turns.

    ``tz`` is an IANA name or tzinfo for the timestamps; long texts are cut at 2,000
    characters unless ``full``. Returns lines without newlines. Raises
    ZoneInfoNotFoundError for an unknown zone name.
    """
    zone = ZoneInfo(tz) if isinstance(tz, str) else tz
    r = _Renderer(zone, full)
    lines: list[str] = []
    turn: list[TimelineEvent] = []
    number = 0

    def close() -> None:
        nonlocal turn, number
        if turn:
            number += 1
            lines.extend(r.turn(number, turn))
            turn = []

    for ev in events:
        c = ev.content if isinstance(ev.content, dict) else {}
        if ev.event_type not in _TURN_TYPES:
            if turn:  # e.g. a cron run recorded while a turn was running
                turn.append(ev)
            else:
                lines.extend(r.single(ev))
            continue
        turn.append(ev)
        answered = ev.event_type == "LLM_RESPONSE" and not c.get("tool_calls")
        cut = ev.event_type == "TOOL_RESULT" and str(c.get("result", "")).startswith(
            _END_OF_TURN_RESULT)
        if answered or cut:
            close()
    close()
    while lines and lines[-1] == "":
        lines.pop()
    return [line for i, line in enumerate(lines) if line or (i and lines[i - 1])]
