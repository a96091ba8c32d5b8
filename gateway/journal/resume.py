"""What happens to unfinished journal entries at start and at shutdown (issue 8 "Crash
and shutdown lose accepted messages"; README "Delivery guarantees").

At start every entry not ``done`` is resumed before any new message runs, in lane order
(the turns that had started first, then the queued entries, each oldest first):

- never started: it runs (``run``);
- started, no side-effecting tool began: the turn is run again (``rerun``); the user
  message already in the transcript is not appended a second time, unless a later
  user message follows it there (another turn ran first): then it is written again, so
  the model answers it and not that later one. When the transcript
  already holds the turn's final answer (the process died after the turn, before its
  reply was marked as sending), that answer is delivered instead of calling the model
  again (it would answer an empty turn);
- started and side-effecting tools began: they are not run again blindly. The session
  gets a system event naming the interrupted message and the tools that ran, the user one
  short notice, and the turn continues from the transcript (``continue``);
- delivery of its reply had begun: the turn is not re-run; the reply is resolved like any
  send whose outcome is unknown: Discord resends it with the same nonces (idempotent),
  Slack looks it up and posts only what is missing, Telegram records it as
  ``unconfirmed`` (log and ``tidegate status``). A *streamed* reply (marked before its
  first piece was posted) is never posted again: what the chat shows may be cut off, so
  the user gets one short notice saying so (``delivery: stream_cut``).

Each resumed or abandoned entry is one structured log record with its session key
(``journal_entry_resumed`` / ``journal_entry_abandoned``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from gateway.inbound.albums import gated_message, group_entries, is_gated, merge_works
from gateway.journal import dead_letters
from gateway.journal.store import JournalEntry
from gateway.journal.tracking import work_from_dict
from gateway.turns.work import UserWork
from runtime.transcript import iter_entries_reversed

log = structlog.get_logger(__name__)

INTERRUPTED_NOTICE = ("(The gateway restarted while I was working on your message. Some "
                      "steps had already run; I am continuing from where I stopped.)")
STREAM_CUT_NOTICE = ("⚠️ The gateway restarted while my reply above was being written, so it "
                     "may be cut off. Ask again if you need the rest.")
TRANSCRIPT_LOOKBACK = 200  # entries searched backwards for a resumed user message


def resume_action(entry: JournalEntry) -> str:
    """``run`` | ``rerun`` | ``continue`` | ``reply`` for an unfinished entry."""
    if not entry.started:
        return "run"
    if entry.replying:
        return "reply"
    return "continue" if entry.tools else "rerun"


def interrupted_event(work: UserWork, tools: list[str]) -> str:
    """The system event for a ``continue`` resume (JSON-free plain text; the message
    text itself is not repeated: it is in the transcript)."""
    ran = ", ".join(dict.fromkeys(tools))
    return (f"A gateway restart interrupted the turn for message {work.message_id or '?'} "
            f"on {work.channel}. These tools had already started and were not run again: "
            f"{ran}. Check what they did before repeating anything, then continue.")


async def resume_unfinished(gw: Any) -> dict[str, int]:
    """Resume every unfinished entry of ``gw.journal`` (see module docstring). ``gw``
    offers ``journal``, ``journal_tracker``, ``lanes``, ``deliverer``, ``dedupe`` and
    ``scheduling``. Returns counts per action."""
    counts: dict[str, int] = {}
    replies: set[str] = set()
    await _restore_held(gw, counts)
    # Started entries first: they were ahead of the queued ones on their session's lane.
    # The parts of one album (gateway/inbound/albums.py) are resumed together, as one turn.
    # Only those left by the last run: release() runs what was accepted since the start.
    before = getattr(getattr(gw, "intake", None), "resumable", None)
    unfinished = [e for e in gw.journal.unfinished() if not is_gated(e)
                  and (before is None or e.id in before)]
    for group in group_entries(sorted(unfinished, key=lambda e: not e.started)):
        works = []
        for entry in group:
            counts[resume_action(entry)] = counts.get(resume_action(entry), 0) + 1
            if entry.dedupe and gw.dedupe is not None:
                gw.dedupe.check_and_mark(entry.dedupe)  # a redelivery must not run it twice
            try:
                works.append((entry, work_from_dict(entry.work, entry.id)))
            except (TypeError, ValueError) as exc:
                gw.outcomes.record_message({"journal_id": entry.id}, "failed",
                                           f"unreadable journal entry: {exc}",
                                           session_key=entry.session_key)
                log.error("journal_entry_abandoned", session_key=entry.session_key,
                          entry_id=entry.id, reason=f"unreadable entry: {exc}")
        if not works:
            continue
        entry, action = works[0][0], resume_action(works[0][0])
        if dead_letters.due(entry):  # it failed the same way 3 times: not replayed again
            for e, _ in works:
                await dead_letters.set_aside(gw, e)
            counts["dead-lettered"] = counts.get("dead-lettered", 0) + len(works)
            continue
        if action == "reply":  # one resend per reply key: a merged turn shares one
            for e, w in works:
                await _resolve_reply(gw, e, w, replies)
            continue
        if action == "run" and works[0][1].album:  # the album's rest may still come
            _rejoin_album(gw, entry, [w for _, w in works])
            continue
        work = works[0][1] if len(works) == 1 else merge_works([w for _, w in works])
        await _resume(gw, entry, work, action)
    return counts


def _rejoin_album(gw: Any, entry: JournalEntry, works: list[UserWork]) -> None:
    """Album parts that never ran wait ``media.album_wait`` again in the album buffer
    (gateway/inbound/albums.py), merged with any part delivered since the restart."""
    first = works[0]
    log.warning("journal_entry_resumed", session_key=entry.session_key, entry_id=entry.id,
                album_parts=[w.journal_id for w in works[1:]], action="run",
                channel=first.channel, message_id=first.message_id, waiting="album",
                age_s=round(gw.clock.time() - entry.accepted_at, 3))
    gw.intake.albums.resume(str(first.album), entry.session_key, works)


async def _restore_held(gw: Any, counts: dict[str, int]) -> None:
    """Album parts the last run held for a mention (gateway/inbound/albums.py): a part
    whose album had passed is accepted now, so the resume below merges it into the
    album's turn; one whose album had not is held again (the mentioning part may still
    come); one accepted just before the crash is only finished."""
    entries = gw.journal.unfinished()
    rest = [e for e in entries if not is_gated(e)]
    passed = {(e.session_key, e.work.get("album")) for e in rest if e.work.get("album")}
    accepted = {e.dedupe for e in rest if e.dedupe}
    for entry in (e for e in entries if is_gated(e)):
        row = entry.work["gated"]
        action = "held_again"
        try:
            if entry.dedupe and entry.dedupe in accepted:
                action = "already_accepted"
                gw.journal.done(entry.id)
            elif (entry.session_key, entry.work.get("album")) in passed:
                action = "album_part"
                await gw.intake.accept_held(gated_message(row, _refetch(gw, row)), entry.id)
            else:
                gw.intake.albums.restore(str(entry.work.get("album")), entry.session_key,
                                         gated_message(row, _refetch(gw, row)), entry.id)
        except (TypeError, KeyError, ValueError) as exc:
            gw.journal.done(entry.id)
            log.error("journal_entry_abandoned", session_key=entry.session_key,
                      entry_id=entry.id, reason=f"unreadable held album part: {exc}")
            continue
        counts[action] = counts.get(action, 0) + 1
        log.info("journal_entry_resumed", session_key=entry.session_key, entry_id=entry.id,
                 action=action, channel=row.get("channel"), message_id=row.get("message_id"))


def _refetch(gw: Any, row: dict[str, Any]) -> Any:
    """The adapter's ``media_fetch(handle, name)`` for a held part's channel, or None."""
    channel = gw.deliverer.find(str(row.get("channel")), str(row.get("account_id") or
                                                             "default"))
    return getattr(channel, "media_fetch", None)


async def _resolve_reply(gw: Any, entry: JournalEntry, work: UserWork,
                         replies: set[str]) -> None:
    """The crash came while the reply was being sent: resolve it like any send whose
    outcome is unknown (gateway/outbound/delivery.py ``resend_unknown``), once per reply (a
    merged batch shares one)."""
    reply = entry.reply or {}
    key = str(reply.get("key") or entry.id)
    outcome = "already resolved"
    if key not in replies and work.route is not None and reply.get("stream") == "draft" \
            and reply.get("text"):
        replies.add(key)  # only drafts were shown (they lapse): nothing is in the chat
        sent = await gw.deliverer.send(work.route, str(reply["text"]),
                                       session_key=entry.session_key,
                                       reply_to=work.message_id)
        outcome = "delivered" if sent.ok else "failed"
    elif key not in replies and work.route is not None and reply.get("stream"):
        replies.add(key)  # its pieces are in the chat: a second copy would double them
        await gw.deliverer.send(work.route, STREAM_CUT_NOTICE, kind="notice",
                                session_key=entry.session_key)
        outcome = "stream_cut"
    elif key not in replies and work.route is not None and reply.get("text"):
        replies.add(key)
        outcome = await gw.deliverer.resend_unknown(
            work.route, str(reply["text"]), since=float(reply.get("ts") or entry.accepted_at),
            session_key=entry.session_key, idempotency_key=key, reply_to=work.message_id)
    gw.outcomes.record([work], *_reply_outcome(outcome), session_key=entry.session_key)
    gw.journal.done(entry.id)
    record = log.warning if outcome == "unconfirmed" else log.info
    record("journal_entry_resumed" if outcome == "delivered" else "journal_entry_abandoned",
           session_key=entry.session_key, entry_id=entry.id, action="reply",
           channel=work.channel, message_id=work.message_id, delivery=outcome)


def _reply_outcome(delivery: str) -> tuple[str, str]:
    """The outcome of a message whose reply was being sent when the process died."""
    if delivery == "stream_cut":
        return "interrupted", "a restart cut off the streamed reply; the user was told"
    if delivery == "failed":
        return "failed", "the reply could not be resent after a restart"
    if delivery == "already resolved":
        return "replied", "its reply, shared with the messages merged into its turn, was resolved"
    return "replied", f"reply resolved after a restart: {delivery}"


async def _resume(gw: Any, entry: JournalEntry, work: UserWork, action: str) -> None:
    if action != "run":
        work.resume = action
    # the re-run's context still holds what tainted the turn (album parts: one turn)
    work.tainted_by = list(dict.fromkeys(entry.taint + [t for e in gw.journal.unfinished()
                                                        if e.id in work.album_parts
                                                        for t in e.taint]))
    if action == "continue":
        gw.scheduling.enqueue(entry.session_key, interrupted_event(work, entry.tools),
                              "gateway.resume")
        if work.route is not None:
            await gw.deliverer.send(work.route, INTERRUPTED_NOTICE, kind="notice",
                                    session_key=entry.session_key)
    log.warning("journal_entry_resumed", session_key=entry.session_key, entry_id=entry.id,
                album_parts=list(work.album_parts), action=action, channel=work.channel,
                message_id=work.message_id,
                tools=list(entry.tools), previous_run_id=entry.run_id,
                age_s=round(gw.clock.time() - entry.accepted_at, 3))
    fut = gw.lanes.submit(entry.session_key, work)
    gw.journal_tracker.watch(work, fut)
    gw.outcomes.watch(work, entry.session_key, fut)


LEGACY_PENDING = "pending-inbound.json"  # the clean-stop file of earlier versions


def import_legacy_pending(state_dir: Path, journal: Any) -> int:
    """Move the messages an earlier version kept in ``pending-inbound.json`` at a clean
    stop (``[{"session_key", "work": {UserWork fields}}]``) into the journal, so an
    upgrade loses none; the file is removed. Unreadable: renamed ``.corrupt`` and logged.
    Returns how many were imported."""
    path = state_dir / LEGACY_PENDING
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
        items = [(str(r["session_key"]), dict(r["work"])) for r in rows]
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        path.rename(path.with_name(path.name + ".corrupt"))
        log.error("state_file_corrupt", owner="pending inbound (legacy)", path=str(path),
                  error=str(exc), effect="its messages were not imported",
                  fix="the bytes are kept in pending-inbound.json.corrupt")
        return 0
    for key, work in items:
        journal.accept(key, work)
    path.unlink()
    log.warning("pending_inbound_imported", count=len(items), path=str(path))
    return len(items)


def stop_marked(journal: Any) -> None:
    """At an orderly shutdown, once the lanes drained: mark the attempts the grace period
    cut off as stopped by the operator (gateway/journal/store.py ``stopped``), so the next
    start resumes them without counting a crash toward their dead letter. Unwritable:
    logged; the next start then charges them by the bystander rule, as after a crash."""
    try:
        ids = journal.stopped()
    except OSError as exc:
        log.error("journal_write_failed", path=str(journal.path), error=str(exc),
                  effect="the turns cut off by this stop count as crashes at the next start")
        return
    if ids:
        log.info("journal_stop_marked", entry_ids=ids)


def report_unfinished(journal: Any) -> None:
    """At shutdown: one record per entry left for the next start, with its session key
    (``turn_cancelled_at_shutdown`` for a turn cut off by the grace period,
    ``inbound_kept_for_restart`` for one that never started)."""
    for entry in journal.unfinished():
        if entry.started:
            log.warning("turn_cancelled_at_shutdown", session_key=entry.session_key,
                        entry_id=entry.id, run_id=entry.run_id, tools=list(entry.tools),
                        next="resumed at the next start")
        else:
            log.warning("inbound_kept_for_restart", session_key=entry.session_key,
                        entry_id=entry.id, next="run at the next start")


def logged_messages(entries: Path | Iterator, message_ids: list[str | None]
                    ) -> tuple[set[str], set[str]]:
    """Which of a resumed turn's user messages ``message_ids`` (their ``messageId``) the
    transcript at ``path`` (or the entries iterator, newest first, of any transcript
    store) holds as its newest user messages, within its last
    :data:`TRANSCRIPT_LOOKBACK` entries: those are not appended a second time. Returns
    ``(those ids, the ids found only further back)``.

    A user message of another turn (a later message that ran first: taken over out of
    order, or its done mark lost with the process; a cron or heartbeat prompt) ends the
    tail: the transcript has moved past the resumed messages older than it. Counted as
    written, the re-run would show the model that later message as the newest one and
    answer it again, leaving its own message unanswered; written again, the model
    answers the message the turn is for."""
    wanted = {str(i) for i in message_ids if i}
    tail: set[str] = set()
    behind: set[str] = set()
    if not wanted:
        return tail, behind
    items = iter_entries_reversed(entries) if isinstance(entries, Path) else entries
    passed = False  # a user message of another turn was seen: the tail ended
    for n, (entry, _) in enumerate(items):
        if n >= TRANSCRIPT_LOOKBACK or tail | behind == wanted:
            break
        msg = (entry or {}).get("message") or {}
        if msg.get("role") != "user":
            continue
        mid = str(msg.get("messageId"))
        if mid not in wanted:
            passed = True
        elif mid not in tail:
            (behind if passed else tail).add(mid)
    return tail, behind - tail


def answered_in_transcript(entries: Iterator, message_ids: list[str]) -> str | None:
    """The final answer a finished turn wrote for the resumed user messages
    ``message_ids``, or None. ``entries``: the transcript's entries newest first (as
    :func:`logged_messages`). The answer is the last assistant text without tool
    calls between the newest of those messages and the next user message; None when there
    is none (the turn had not finished) or the messages are not in the last
    :data:`TRANSCRIPT_LOOKBACK` entries."""
    wanted = {str(i) for i in message_ids if i}
    if not wanted:
        return None
    answer: str | None = None  # the newest final assistant text seen since a user message
    for n, (entry, _) in enumerate(entries):
        if n >= TRANSCRIPT_LOOKBACK:
            return None
        msg = (entry or {}).get("message") or {}
        role = msg.get("role")
        if role == "user":
            if str(msg.get("messageId")) in wanted:
                return answer
            answer = None  # a later user message's turn: not ours
        elif role == "assistant" and answer is None and msg.get("stopReason") != "toolUse":
            content = msg.get("content") or []
            texts = [c.get("text", "") for c in content if isinstance(c, dict)
                     and c.get("type") == "text"]
            if texts and not any(isinstance(c, dict) and c.get("type") == "toolCall"
                                 for c in content):
                answer = "".join(texts)
    return None
