"""The checker: verifies a recorded :class:`History` and returns anomalies by kind.

Checks (each anomaly kind names the property it breaks):

- ``overlapping-calls``: two model calls of one session overlap in time (a session's
  turns are serial cluster-wide);
- ``lost-history``: a model call's prompt lacks a message an earlier call of the session
  answered and whose reply was delivered (the conversation forked or lost a turn); each
  lost message is counted once per session;
- ``history-out-of-order``: a prompt holds two answered messages in the order opposite
  to the calls that answered them;
- ``real-time-order``: a message sent after another one's reply had arrived (same
  session) reached the model first;
- ``split-session``: a session key with more than one session id (timelines in
  PostgreSQL), or a sessions row naming a session id that has no timeline;
- ``lost-reply``: an accepted message with no delivered reply and no recorded outcome
  (``replied`` alone is none; ``replied`` as ``unconfirmed`` is: :func:`outcome_of`);
- ``duplicate-reply``: a message answered more than once (Telegram: two echoes in the
  chat), ``misrouted-reply``: a reply delivered on a surface the message did not come
  from, ``wrong-reply``: an HTTP/CLI answer that is not the echo of its own message;
- ``timeline-verify``: ``tidegate timeline verify`` did not exit 0;
- ``cron-lost`` / ``cron-twice`` / ``cron-unfinished``: a cron due time skipped, run by
  more model calls than its occurrence rows explain, or left running;
- ``replica-down``: a replica that did not come back when the nemesis or the final heal
  started it.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.cluster_check.generator import Op
from tests.cluster_check.model import Call, message_ids
from tests.cluster_check.nemesis import Fault

EPS = 0.002  # s: timestamps of one machine
WINDOW = 10  # earlier calls a prompt is checked against (the history window stays above)


@dataclass
class History:
    """Everything recorded by a run (epoch seconds throughout)."""

    ops: list[Op]
    calls: list[Call]
    faults: list[Fault]
    chats: dict[int, list[dict[str, Any]]]  # chat id -> bot messages {text, time}
    timelines: list[tuple[str, str]]  # (session key, session id)
    sessions: list[tuple[str, str]]
    outcomes: dict[tuple[str, str], list[str]]  # (session key, message id) -> outcomes
    cron_rows: list[tuple[float, str, int]]  # (due_at, state, attempts)
    cron_every: float
    verify: tuple[int, str]
    down: list[str] = field(default_factory=list)
    # due times the cron service skipped because the previous run was still in progress
    # (a documented rule: runs of one job never overlap; e.g. a run waiting out an outage,
    # or for the lane of a killed replica: logged when that run ends)
    cron_skipped: list[float] = field(default_factory=list)
    # the cron run log's scheduled runs: (due_at, started_at, finished_at), one per run a
    # replica finished (a killed run has none)
    cron_runs: list[tuple[float, float, float]] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0


def _add(out: dict[str, list[str]], kind: str, text: str) -> None:
    out.setdefault(kind, []).append(text)


def delivered(h: History) -> dict[int, list[tuple[str, float]]]:
    """message id -> [(surface, time)] of every reply naming it."""
    out: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for msgs in h.chats.values():
        for m in msgs:
            if m["text"].startswith("echo: "):
                for i in message_ids(m["text"]):
                    out[i].append(("telegram", m["time"]))
    for op in h.ops:
        if op.surface != "telegram" and op.status == "ok":
            for i in message_ids(op.reply):
                out[i].append((op.surface, op.done))
    return out


def check_calls(h: History, out: dict[str, list[str]]) -> None:
    answered = {i for i, v in delivered(h).items() if v}
    by_session: dict[str, list[Call]] = defaultdict(list)
    for c in h.calls:
        if c.session.startswith("s"):
            by_session[c.session].append(c)
    for s, calls in by_session.items():
        calls.sort(key=lambda c: c.start)
        for a, b in itertools.combinations(calls, 2):
            if b.start < (a.end or h.end) - EPS and b.start >= a.start:
                _add(out, "overlapping-calls", f"{s}: m{a.last} [{a.start - h.start:.2f}, "
                     f"{a.end - h.start:.2f}] and m{b.last} from {b.start - h.start:.2f}")
        reported: set[int] = set()  # a lost message is named once, by the first call
        for k, c in enumerate(calls):
            before = [p for p in calls[:k] if p.end and p.end <= c.start + EPS][-WINDOW:]
            missing = sorted({i for p in before for i in p.last if i in answered}
                             - set(c.prompt) - reported)
            reported.update(missing)
            if missing:
                _add(out, "lost-history", f"{s}: the call for m{c.last} at "
                     f"{c.start - h.start:.2f}s lacks m{missing} (answered before; "
                     f"prompt {c.prompt})")
            pos = {i: n for n, i in enumerate(c.prompt)}
            last_call = {i: n for n, p in enumerate(before) for i in p.last}  # a re-run
            # counts where it ran last; its own message comes after all of them
            order = [i for i, _ in sorted(last_call.items(), key=lambda x: x[1])
                     if i in answered and i in pos and i not in c.last]
            order += [i for i in c.last if i in pos]
            if any(pos[x] > pos[y] for x, y in itertools.pairwise(order)):
                _add(out, "history-out-of-order", f"{s}: the call for m{c.last} holds "
                     f"{c.prompt}, answered in the order {order}")


def check_real_time(h: History, out: dict[str, list[str]]) -> None:
    first_call: dict[int, float] = {}
    for c in sorted(h.calls, key=lambda c: c.start):
        for i in c.last:
            first_call.setdefault(i, c.start)
    replied = delivered(h)
    by_session: dict[int, list[Op]] = defaultdict(list)
    for op in h.ops:
        if op.sent:
            by_session[op.session].append(op)
    for s, ops in by_session.items():
        for a in ops:
            got = [t for _, t in replied.get(a.id, [])]
            if not got or a.id not in first_call:
                continue
            for b in ops:
                if b.sent > min(got) + EPS and b.id in first_call and \
                        first_call[b.id] < first_call[a.id]:
                    _add(out, "real-time-order", f"s{s}: m{b.id} sent after m{a.id}'s reply "
                         "reached the model first")


def check_sessions(h: History, out: dict[str, list[str]]) -> None:
    ids: dict[str, set[str]] = defaultdict(set)
    for key, sid in h.timelines:
        ids[key].add(sid)
    for key, sids in sorted(ids.items()):
        if len(sids) > 1:
            _add(out, "split-session", f"{key}: {len(sids)} session ids {sorted(sids)}")
    known = {sid for _, sid in h.timelines}
    for key, sid in h.sessions:
        if sid not in known:
            _add(out, "split-session", f"{key}: sessions row names {sid}, no timeline")


def outcome_of(row: dict[str, Any]) -> str:
    """The outcome of a ``sessions outcomes --json`` row; ``unconfirmed`` for a reply
    whose send a crash cut and whose arrival the platform cannot be asked about
    (Telegram): recorded ``replied`` with that detail and never resent (at most once,
    docs/outcomes.md), so an outcome, not a lost reply (counted in the report)."""
    outcome = str(row.get("outcome"))
    if outcome == "replied" and "unconfirmed" in str(row.get("detail") or ""):
        return "unconfirmed"
    return outcome


def check_replies(h: History, out: dict[str, list[str]]) -> None:
    replied = delivered(h)
    from tests.cluster_check.cluster import key_of
    for op in h.ops:
        got = replied.get(op.id, [])
        if op.surface == "telegram":
            mine = [s for s, _ in got if s == "telegram"]
            if len(mine) > 1:
                _add(out, "duplicate-reply", f"m{op.id} (telegram, s{op.session}): "
                     f"{len(mine)} replies")
            elif not mine:
                recorded = h.outcomes.get((key_of(op.session), str(op.tg_id)), [])
                if not [o for o in recorded if o != "replied"]:
                    _add(out, "lost-reply", f"m{op.id} (telegram, s{op.session}, sent at "
                         f"{op.sent - h.start:.2f}s): no reply; outcomes {recorded}")
        elif op.status == "ok" and message_ids(op.reply) != [op.id]:
            _add(out, "wrong-reply", f"m{op.id} ({op.surface} on {op.replica}): "
                 f"answered {op.reply!r}")
        others = [s for s, _ in got if s != op.surface]
        if others:
            _add(out, "misrouted-reply", f"m{op.id} ({op.surface}): replied on {others}")


def check_cron(h: History, out: dict[str, list[str]]) -> None:
    if not h.cron_every:
        return
    rows = sorted(h.cron_rows)
    dues = sorted([r[0] for r in rows] + list(h.cron_skipped))
    for a, b in itertools.pairwise(dues):
        if b - a > 1.5 * h.cron_every:
            _add(out, "cron-lost", f"no occurrence between due {a - h.start:.1f}s and "
                 f"{b - h.start:.1f}s (every {h.cron_every:g}s)")
    if rows and h.end - rows[-1][0] > 2.5 * h.cron_every:
        _add(out, "cron-lost", f"no occurrence after due {rows[-1][0] - h.start:.1f}s")
    for due, state, _attempts in rows:
        # an occurrence due just before the history was collected may still be running
        if state != "done" and due < h.end - max(5.0, 2 * h.cron_every):
            _add(out, "cron-unfinished", f"due {due - h.start:.1f}s left {state}")
    cron_calls = sorted((c for c in h.calls if c.session.startswith("cron:")),
                        key=lambda c: c.start)
    dues = [due for due, _, _ in rows]
    per_due: Counter[float] = Counter()
    owned: dict[float, list[float]] = defaultdict(list)  # due -> its calls' starts
    for c in cron_calls:
        t = c.start
        owner = cron_owner(h, t, dues, c.end or t)
        if owner is None:
            _add(out, "cron-twice", f"a cron model call at {t - h.start:.2f}s before any "
                 "claimed occurrence")
        else:
            per_due[owner] += 1
            owned[owner].append(t)
    for due, _state, attempts in rows:
        if per_due[due] > attempts:
            _add(out, "cron-twice", f"due {due - h.start:.2f}s: {per_due[due]} model calls, "
                 f"{attempts} attempt(s) claimed; calls at "
                 f"{[round(t - h.start, 2) for t in owned[due]]}")


def cron_owner(h: History, t: float, dues: list[float], end: float | None = None
               ) -> float | None:
    """The due time a cron model call from ``t`` to ``end`` ran for: the due time of the
    logged run whose span holds the call (a run delayed past the next due time, by an
    outage or a wait for its lane, is its own due time's). When several logged runs hold
    it (runs of different replicas, each waiting for the lane in turn), the one that
    ended first after the call: a run ends as soon as its turn did, the others were
    still waiting (the calls of runs holding one another are still all counted for their
    due times, so a due time run twice is still found). Else (no logged run, e.g.
    killed) the latest claimed due time at or before ``t``. None when no due time was
    claimed by then."""
    end = t if end is None else end
    spans = sorted((r_end, due) for due, start, r_end in h.cron_runs
                   if start - EPS <= t and end <= r_end + EPS)
    for _, due in spans[:1]:  # (the run log has milliseconds, as the ledger's keys)
        claimed = [d for d in dues if abs(d - due) < EPS and d <= t + EPS]
        if claimed:
            return claimed[0]
    return max((d for d in dues if d <= t + EPS), default=None)


def check(h: History) -> dict[str, list[str]]:
    """Anomalies by kind (empty when the history is clean)."""
    out: dict[str, list[str]] = {}
    check_calls(h, out)
    check_real_time(h, out)
    check_sessions(h, out)
    check_replies(h, out)
    check_cron(h, out)
    if h.verify[0] != 0:
        _add(out, "timeline-verify", h.verify[1][-300:])
    for d in h.down:
        _add(out, "replica-down", d)
    for f in h.faults:
        if f.note.startswith("did not recover"):
            _add(out, "replica-down", f"{f.kind} {f.target}: {f.note}")
    return out


def summary(h: History) -> dict[str, Any]:
    """Operation and fault counts for the report."""
    return {"ops": Counter(f"{op.surface}:{op.status}" for op in h.ops),
            "faults": Counter(f.kind for f in h.faults if f.start),
            "model_calls": len(h.calls),
            "unconfirmed": sum(1 for v in h.outcomes.values() if "unconfirmed" in v),
            "reruns": sum(1 for _, n in Counter(i for c in h.calls for i in c.last).items()
                          if n > 1)}
