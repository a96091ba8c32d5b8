"""Timeline export, offline verification, replay rendering and transcript rebuild.

Pure functions over :class:`~runtime.timeline.model.TimelineEvent` lists (seed 000 §4.2
"replay the decision process", §4.3 audit/third-party verification). Nothing here touches
the database; ``write_export_file`` and ``verify_export_file`` touch only the given file.

Export format (JSONL, UTF-8, one JSON object per line):

- line 1, header: ``{"type": "timeline_export", "session_id", "session_key", "count": N,
  "first_seq", "base_hash", "head_hash", "exported_at": RFC 3339 | null}`` where
  ``base_hash`` is the ``prev_hash`` of the first exported event (the genesis hash for a
  whole-session export, ``first_seq`` 1) and ``head_hash`` the ``hash`` of the last;
- lines 2..N+1: one event each, all eight event fields (keys sorted).

The file verifies itself: recompute each event's hash, follow ``prev_hash`` links from
``base_hash``, then compare count and ``head_hash`` with the header. The header's
``session_key`` is not hashed, so when the export starts at seq 1 it must equal the
``session_key`` in the (hashed) SESSION_CREATE content; a partial export's key is unchecked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from runtime.clock import format_elapsed, utc_iso
from runtime.fsutil import atomic_write
from runtime.timeline.model import (
    GENESIS_HASH,
    ChainChecker,
    TimelineEvent,
    VerifyReport,
    canonical_content,
)

_EVENT_KEYS = ("event_id", "session_id", "seq", "timestamp", "event_type", "content",
               "prev_hash", "hash")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def export_jsonl(
    events: list[TimelineEvent],
    *,
    session_key: str | None = None,
    exported_at: float | None = None,
) -> list[str]:
    """Export one session's events (in seq order) as JSONL lines without newlines.

    ``exported_at`` is epoch seconds (None leaves it null). ``session_key`` defaults to the
    SESSION_CREATE's when the events start at seq 1. Raises ValueError when ``events`` is
    empty, mixes sessions, or ``session_key`` contradicts the SESSION_CREATE content.
    """
    if not events:
        raise ValueError("nothing to export: no events")
    sid = events[0].session_id
    if any(e.session_id != sid for e in events):
        raise ValueError("export_jsonl takes the events of a single session")
    if events[0].seq == 1:
        created = events[0].content.get("session_key")
        if session_key is None:
            session_key = created
        elif session_key != created:
            raise ValueError(f"session_key {session_key!r} contradicts the SESSION_CREATE "
                             f"event ({created!r})")
    header = {
        "type": "timeline_export",
        "session_id": sid,
        "session_key": session_key,
        "count": len(events),
        "first_seq": events[0].seq,
        "base_hash": events[0].prev_hash,
        "head_hash": events[-1].hash,
        "exported_at": utc_iso(exported_at) if exported_at is not None else None,
    }
    return [_dumps(header)] + [_dumps(e.to_dict()) for e in events]


def write_export_file(path: str | Path, lines: Iterable[str]) -> None:
    """Write export lines to ``path`` atomically (temp file + fsync + rename)."""
    atomic_write(Path(path), "".join(line + "\n" for line in lines).encode("utf-8"),
                 mode=0o644)


def verify_export_file(path: str | Path) -> VerifyReport:
    """Check an export file offline (no database), streaming it line by line.

    Returns a :class:`VerifyReport`; on failure ``line`` is the 1-based line number and
    ``seq``/``event_id`` name the event on it when they could be read. Raises OSError if
    the file cannot be read.
    """
    report = VerifyReport()
    checker = ChainChecker()
    header: dict[str, Any] | None = None
    count = 0
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                return report.fail("invalid event", line=lineno, detail="blank line")
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                what = "invalid export header" if header is None else "invalid event"
                return report.fail(what, line=lineno, detail=f"not JSON: {exc}")
            if header is None:
                if not isinstance(obj, dict) or obj.get("type") != "timeline_export":
                    return report.fail("invalid export header", line=1,
                                       detail='first line must be {"type": "timeline_export", ...}')
                header = obj
                report.sessions_checked = 1
                checker.start(obj.get("session_id"), first_seq=int(obj.get("first_seq") or 1),
                              prev_hash=obj.get("base_hash") or GENESIS_HASH)
                continue
            count += 1
            report.events_checked = count
            if _check_event(report, checker, header, obj, lineno) is not None:
                return report
    if header is None:
        return report.fail("invalid export header", line=1, detail="empty file")
    return _check_totals(report, checker, header, count)


def _check_event(report: VerifyReport, checker: ChainChecker, header: dict[str, Any],
                 obj: Any, lineno: int) -> VerifyReport | None:
    """One event line of an export against the chain so far: the failed ``report``, or
    None when it is sound."""
    if not isinstance(obj, dict) or any(k not in obj for k in _EVENT_KEYS):
        return report.fail("invalid event", line=lineno, session_id=header["session_id"],
                           detail="missing event fields")
    where = {"line": lineno, "session_id": obj["session_id"], "seq": obj["seq"],
             "event_id": obj["event_id"]}
    if obj["session_id"] != header["session_id"]:
        return report.fail("invalid event", detail="session_id differs from header", **where)
    try:
        content = canonical_content(obj["content"])
    except (TypeError, ValueError) as exc:
        return report.fail("invalid event", detail=str(exc), **where)
    bad = checker.check(obj["event_id"], obj["seq"], obj["timestamp"], obj["event_type"],
                        content, obj["prev_hash"], obj["hash"])
    if bad is not None:
        return report.fail(bad[0], detail=bad[1], **where)
    if obj["seq"] == 1 and header.get("session_key") != checker.created_key:
        # The header is not hashed: a forged key would pass every other check.
        return report.fail(
            "session_key mismatch", line=1, session_id=header["session_id"], seq=1,
            event_id=obj["event_id"],
            detail=f"header says {header.get('session_key')!r}, SESSION_CREATE "
                   f"(line {lineno}) says {checker.created_key!r}")
    return None


def _check_totals(report: VerifyReport, checker: ChainChecker, header: dict[str, Any],
                  count: int) -> VerifyReport:
    """The header's ``count`` and ``head_hash`` against what the file held."""
    if count != header.get("count"):
        return report.fail("count mismatch", session_id=header["session_id"],
                           detail=f"header says {header.get('count')}, file has {count} events")
    if checker.last_hash != header.get("head_hash"):
        return report.fail("head_hash mismatch", session_id=header["session_id"],
                           seq=checker.last_seq, event_id=checker.last_event_id,
                           detail="last event's hash differs from header head_hash")
    return report


# ---- replay ---------------------------------------------------------------------------


def _short(text: Any, width: int = 120) -> str:
    s = text if isinstance(text, str) else _dumps(text)
    s = " ".join(s.split())
    return s if len(s) <= width else s[: width - 1] + "…"


def _delta(ms: int) -> str:
    if ms < 1000:
        return f"+{ms}ms"
    if ms < 60_000:
        return f"+{ms / 1000:.2f}s"
    return "+" + format_elapsed(ms / 1000)


def _call(c: dict[str, Any]) -> str:
    return f"{c.get('name', '?')}({_short(c.get('arguments', {}), 80)})"


def describe_event(etype: str, c: dict[str, Any]) -> str:
    """One-line human rendering of an event's content (``replay_lines``, ``timeline show``)."""
    if etype == "SESSION_CREATE":
        return f"session {c.get('session_key', '')}"
    if etype == "USER_INPUT":
        who = f"user[{c['sender']}]" if c.get("sender") else "user"
        return f"{who}: {_short(c.get('text', ''))}"
    if etype == "LLM_RESPONSE":
        out = f"assistant ({c.get('model', '?')}): {_short(c.get('text', ''))}"
        calls = c.get("tool_calls") or []
        if calls:
            out += " -> calls " + ", ".join(_call(t) for t in calls)
        return out
    if etype == "TOOL_CALL":
        return f"call {_call(c)}"
    if etype == "TOOL_RESULT":
        flag = " ERROR" if c.get("is_error") else ""
        dur = f" in {c['duration_ms']}ms" if "duration_ms" in c else ""
        return f"result {c.get('name', '?')}{flag}{dur}: {_short(c.get('result', ''), 100)}"
    if etype == "SYSTEM_EVENT" and c.get("kind") in ("fork", "rewind", "forked_from"):
        return _fork_text(c)
    if etype == "SYSTEM_EVENT" and c.get("kind") == "exec_approval":
        return _approval_text(c)
    if etype == "SYSTEM_EVENT":
        return f"[{c.get('source', '?')}] {_short(c.get('text', ''))}"
    if etype == "HEARTBEAT" and c.get("reason"):
        reply = f": {_short(c['reply'], 80)}" if c.get("reply") else ""
        return (f"beat {c.get('outcome', '?')} ({c['reason']}) in "
                f"{c.get('duration_ms', '?')}ms{reply}")
    if etype == "HEARTBEAT":
        reply = f": {_short(c['reply'], 80)}" if c.get("reply") else ""
        return f"beat {c.get('outcome', '?')} in {c.get('duration_ms', '?')}ms{reply}"
    if etype == "CRON_RUN":
        return f"job {c.get('job_id', '?')} {c.get('status', '?')}"
    if etype == "OUTCOME":
        detail = f": {_short(c['detail'], 80)}" if c.get("detail") else ""
        return f"outcome {c.get('outcome', '?')} of message {c.get('message_id') or '?'}{detail}"
    if etype == "COMPACTION":
        summary = _short(c.get("summary", ""), 80)
        return f"compacted ({c.get('tokens_before', '?')} tokens): {summary}"
    if etype == "SESSION_END":
        return f"ended: {c.get('reason', '')}"
    return _short(c)


def _approval_text(c: dict) -> str:
    """An exec_approval SYSTEM_EVENT (gateway/approvals/service.py) in words: ``requested``
    (id, command, reason), a decision (allowed/denied/expired, by whom) or a policy deny."""
    event, rid = c.get("event", "?"), c.get("id")
    head = f"approval {rid} {event}" if rid else f"exec {event}"
    by = c.get("by")
    who = f" by {by}" if by else ""
    always = " (always)" if c.get("always") else ""
    why = f" — {_short(c['reason'], 80)}" if event in ("requested", "denied") and \
        c.get("reason") else ""
    return f"{head}{always}{who}: {_short(c.get('command', ''), 100)}{why}"


def _fork_text(c: dict) -> str:
    """A fork, rewind or forked_from SYSTEM_EVENT (gateway/sessions/fork.py) in words."""
    if c["kind"] == "forked_from":
        return (f"forked from session {c.get('session_id', '?')} "
                f"({c.get('session_key', '?')}) at turn {c.get('turns', '?')}")
    verb = "rewound to" if c["kind"] == "rewind" else "forked at"
    new = f" {c['new_session_id']}" if c.get("new_session_id") else ""
    return (f"{verb} turn {c.get('turn', '?')} of {c.get('of_turns', '?')} -> "
            f"{c.get('new_session_key', '?')}{new}")


def replay_lines(events: Iterable[TimelineEvent], tz: str | tzinfo = "UTC") -> list[str]:
    """Readable step-by-step playback of a timeline, one line per event.

    Each line: ``#seq``, local time in ``tz`` (IANA name or tzinfo, ms precision), the
    delta since the previous event, the delta since the start of the current turn (a turn
    starts at USER_INPUT and ends at an LLM_RESPONSE without tool calls), the event type
    and a short rendering of the content. Raises ZoneInfoNotFoundError for a bad tz name.
    """
    zone = ZoneInfo(tz) if isinstance(tz, str) else tz
    lines: list[str] = []
    prev: int | None = None
    turn_start: int | None = None
    for ev in events:
        c = ev.content if isinstance(ev.content, dict) else {}
        if ev.event_type == "USER_INPUT":
            turn_start = ev.timestamp
        local = datetime.fromtimestamp(ev.timestamp / 1000, tz=zone)
        stamp = (local.strftime("%Y-%m-%d %H:%M:%S.") + f"{ev.timestamp % 1000:03d} "
                 + local.strftime("%Z"))
        step = "start" if prev is None else _delta(ev.timestamp - prev)
        turn = f"turn {_delta(ev.timestamp - turn_start)}" if turn_start is not None else ""
        lines.append(f"#{ev.seq:<4} {stamp}  {step:>9}  {turn:<14} {ev.event_type:<14} "
                     f"{describe_event(ev.event_type, c)}")
        prev = ev.timestamp
        if ev.event_type == "LLM_RESPONSE" and not c.get("tool_calls"):
            turn_start = None
        if ev.event_type == "SESSION_END":
            turn_start = None
    return lines


# ---- transcript rebuild -----------------------------------------------------------------


TRANSCRIPT_DISCARDED = "discarded"
"""``content["transcript"]`` of the SYSTEM_EVENT the gateway records when a held turn (a
HEARTBEAT_OK beat, an ack-only system turn) left its lines out of the transcript; the
turn's events stay in the timeline, the rebuild leaves them out too."""


def rebuild_transcript_messages(events: Iterable[TimelineEvent]) -> list[dict[str, Any]]:
    """Rebuild the conversation's transcript messages from timeline events alone.

    Output uses the transcript ``message`` shape (OpenClaw v3 session files):

    - USER_INPUT -> ``{"role": "user", "content": [{"type": "text", "text"}], "timestamp",
      "sender"?, "messageId"?, "trigger"?}``
    - LLM_RESPONSE -> ``{"role": "assistant", "content": [{"type": "text", "text"}?,
      {"type": "toolCall", "id", "name", "arguments"}...], "model", "provider", "usage",
      "stopReason", "timestamp"}`` (the text block only when the text is non-empty;
      ``stopReason`` is ``"toolUse"`` when the response called tools, as the turn writes it)
    - TOOL_RESULT -> ``{"role": "toolResult", "toolCallId", "toolName", "content":
      [{"type": "text", "text"}], "isError", "timestamp"}``

    ``timestamp`` is the event's (int ms). TOOL_CALL events repeat calls the LLM_RESPONSE
    already lists and are skipped, unless the response did not list them: then the call
    is added to the last assistant message. A SYSTEM_EVENT with ``transcript: "discarded"``
    drops the messages of the turn just before it (a held turn the gateway did not keep).
    Other event types are not messages.
    """
    out: list[dict[str, Any]] = []
    last_assistant: dict[str, Any] | None = None
    listed: set[str] = set()
    turn_start = 0  # index in ``out`` where the current turn's messages begin
    in_turn = False
    for ev in events:
        c = ev.content
        if ev.event_type in ("USER_INPUT", "LLM_RESPONSE") and not in_turn:
            turn_start, in_turn = len(out), True
        if ev.event_type == "USER_INPUT":
            out.append(_user_message(ev))
        elif ev.event_type == "LLM_RESPONSE":
            last_assistant = _assistant_message(ev)
            calls = c.get("tool_calls") or []
            listed.update(call.get("id") for call in calls)
            out.append(last_assistant)
            if not calls:
                in_turn = False
        elif ev.event_type == "TOOL_CALL":
            if c.get("id") in listed:
                continue
            if last_assistant is None:
                last_assistant = {"role": "assistant", "content": [], "model": "", "provider": "",
                                  "usage": {}, "stopReason": "toolUse", "timestamp": ev.timestamp}
                out.append(last_assistant)
            last_assistant["content"].append(_tool_call_block(c))
            listed.add(c.get("id"))
        elif ev.event_type == "TOOL_RESULT":
            out.append({"role": "toolResult", "toolCallId": c.get("tool_call_id"),
                        "toolName": c.get("name"),
                        "content": [{"type": "text", "text": c.get("result", "")}],
                        "isError": bool(c.get("is_error", False)), "timestamp": ev.timestamp})
        elif ev.event_type == "SYSTEM_EVENT" and c.get("transcript") == TRANSCRIPT_DISCARDED:
            del out[turn_start:]
            last_assistant, in_turn = None, False
    return out


def _user_message(ev: TimelineEvent) -> dict[str, Any]:
    c = ev.content
    msg: dict[str, Any] = {"role": "user",
                           "content": [{"type": "text", "text": c.get("text", "")}],
                           "timestamp": ev.timestamp}
    for src, dst in (("sender", "sender"), ("message_id", "messageId"),
                     ("trigger", "trigger")):
        if c.get(src):
            msg[dst] = c[src]
    return msg


def _assistant_message(ev: TimelineEvent) -> dict[str, Any]:
    c = ev.content
    blocks: list[dict[str, Any]] = []
    if c.get("text"):
        blocks.append({"type": "text", "text": c["text"]})
    calls = c.get("tool_calls") or []
    blocks += [_tool_call_block(call) for call in calls]
    return {"role": "assistant", "content": blocks, "model": c.get("model", ""),
            "provider": c.get("provider", ""), "usage": c.get("usage", {}),
            "stopReason": "toolUse" if calls else c.get("stop_reason", ""),
            "timestamp": ev.timestamp}


def _tool_call_block(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "toolCall", "id": call.get("id"), "name": call.get("name"),
            "arguments": call.get("arguments", {})}
