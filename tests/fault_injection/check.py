"""Collecting what the outside world shows after a run, and checking it.

Observed: every message as its sender saw it, the model's calls, the outcome rows of
``tidegate sessions outcomes --json -n 0``, ``tidegate channels dead-letters list
--json``, ``status --json``, ``/metrics``, and each chat's bot messages on the three
platforms. Anomaly kinds (each names the rule it breaks):

- ``no-outcome``: an accepted message without an outcome row (a platform message; a
  local one that was answered, or that reached the model);
- ``outcome-twice``: a message with more than one outcome row;
- ``outcome-unasked``: an outcome for a local message the gateway never took (a
  request cut off by a kill may end as one ``failed``: its caller is gone);
- ``reply-twice``: a chat shows two replies naming the same message;
- ``replied-unseen``: a platform message whose outcome is ``replied`` with no reply in
  its chat (except ``unconfirmed``: the gateway died while sending it, on a platform
  whose send cannot be made idempotent, so it is never sent again and may be missing); ``reply-misplaced``: a reply naming a message of another chat;
- ``dead-letters``: the dead-letter list is not exactly the poison message (or, when
  the poison's turn reached the model fewer than three times, is not empty either);
- ``unresolved``: ``status`` or ``/metrics`` counts messages without an outcome, or the
  intake journal still holds unfinished entries;
- ``harness``: a message the harness could not send (a bug of the test, not the product).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.fault_injection.load import PLATFORMS, Msg
from tests.fault_injection.model import tags
from tests.fault_injection.system import System


@dataclass
class Observed:
    msgs: list[Msg]
    calls: list[Any]
    outcomes: list[dict[str, Any]]
    dead: list[dict[str, Any]]
    status: dict[str, Any]
    metrics: dict[str, float]
    chats: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def _outcome_rows(sys: System) -> list[dict[str, Any]]:
    return list(sys.cli_json("sessions", "outcomes", "-n", "0"))


def _key(row: dict[str, Any]) -> tuple[str, str]:
    """``(channel, message id)`` of an outcome row; a Telegram message id is unique only
    in its chat (the session key's last part, a DM's chat being its user)."""
    channel, mid = str(row.get("channel")), str(row.get("message_id"))
    if channel == "telegram":
        mid = f"{str(row.get('session_key')).rsplit(':', 1)[-1]}:{mid}"
    return channel, mid


def settle(sys: System, msgs: list[Msg], timeout: float) -> bool:
    """Wait (up to ``timeout`` s) until the gateway runs and every platform message has
    an outcome row and the journal has no unfinished entry; True when it got there."""
    want = {(m.surface, m.platform_id) for m in msgs if m.surface in PLATFORMS}

    def done() -> bool:  # the control API the CLI asks (polled: a CLI run is slow)
        if not sys.running():
            return False
        try:
            got = json.loads(sys.http("/api/outcomes"))
        except (OSError, ValueError):
            return False
        return want <= {_key(r) for r in got["outcomes"]} and got["unresolved"] == 0
    ok = sys.wait(done, timeout, every=1.0)
    time.sleep(1.0)  # a late duplicate would show now
    return ok


def _journal_live(status: dict[str, Any]) -> int:
    for where in (status, status.get("gateway") or {}):
        j = where.get("journal") if isinstance(where, dict) else None
        if isinstance(j, dict) and "live" in j:
            return int(j["live"])
    return -1


def _chats(sys: System) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s in sys.tg.call(lambda: [dict(x) for x in sys.tg.fake.sent]):
        if s.get("method", "").lower() == "sendmessage" and s.get("status", 200) == 200:
            out[("telegram", str(s["payload"].get("chat_id")))].append(
                str(s["payload"].get("text", "")))
    for user in {str(u) for u in ("U0ALICE", "U0BOB")}:
        out[("slack", user)] = list(sys.slack.fake.chat_view("D" + user[1:]))
    fake = sys.dc.fake
    for name in ("alice", "bob"):
        cid = fake.dm_channels.get(getattr(fake, name).id)
        out[("discord", name)] = list(fake.chat_view(cid)) if cid else []
    return dict(out)


_METRIC = re.compile(r"^(tidegate_messages_without_outcome|tidegate_dead_letters)\s+(\S+)$",
                     re.MULTILINE)


def collect(sys: System, msgs: list[Msg]) -> Observed:
    metrics = {k: float(v) for k, v in _METRIC.findall(sys.metrics())}
    return Observed(msgs=msgs, calls=list(sys.model.server.calls),
                    outcomes=_outcome_rows(sys),
                    dead=list(sys.cli_json("channels", "dead-letters", "list")),
                    status=sys.cli_json("status"), metrics=metrics, chats=_chats(sys))


def _add(out: dict[str, list[str]], kind: str, text: str) -> None:
    out.setdefault(kind, []).append(text)


def _local_rows(o: Observed) -> dict[int, list[dict[str, Any]]]:
    """Outcome rows of local messages by message id (one session per message: the
    session key ends with the message's client id)."""
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in o.outcomes:
        if row.get("channel") in ("openai", "webchat"):
            found = re.search(r"fi-m(\d+)$", str(row.get("session_key")))
            if found:
                out[int(found.group(1))].append(row)
    return out


def check_outcomes(o: Observed, out: dict[str, list[str]]) -> None:
    by_platform: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in o.outcomes:
        by_platform[_key(row)].append(row)
    local = _local_rows(o)
    seen = {i for c in o.calls for i in c.ids}
    for m in o.msgs:
        rows = by_platform.get((m.surface, m.platform_id), []) if m.surface in PLATFORMS \
            else local.get(m.id, [])
        names = [r.get("outcome") for r in rows]
        where = f"m{m.id} ({m.surface} {m.user}, sent {m.status})"
        if len(rows) > 1:
            _add(out, "outcome-twice", f"{where}: {names}")
        accepted = m.surface in PLATFORMS or m.status in ("ok", "error") or m.id in seen
        if accepted and not rows:
            _add(out, "no-outcome", f"{where}: no outcome row (model saw it: "
                 f"{m.id in seen}; {m.detail[:120]})")
        # a request cut off by a kill may have been journaled before the process died: after
        # the restart its caller is gone, so it ends as one 'failed' (never a reply)
        cut_off = m.status == "lost" and names == ["failed"]
        if not accepted and rows and not cut_off:
            _add(out, "outcome-unasked", f"{where}: {names}")
        if m.status == "harness-error":
            _add(out, "harness", f"{where}: {m.detail}")


def check_chats(o: Observed, out: dict[str, list[str]]) -> None:
    by_id = {m.id: m for m in o.msgs}
    replied = {(m.surface, m.platform_id) for m in o.msgs if m.surface in PLATFORMS}
    outcome = {_key(r): (r.get("outcome"), str(r.get("detail") or "")) for r in o.outcomes
               if _key(r) in replied}
    shown: Counter[int] = Counter()
    for (surface, chat), texts in o.chats.items():
        count = Counter(i for t in texts if t.startswith("echo: ") for i in tags(t)[:1])
        for i, n in count.items():
            shown[i] += n
            if n > 1:
                _add(out, "reply-twice", f"m{i} shows {n} replies in {surface} {chat}")
            m = by_id.get(i)
            if m is not None and (m.surface, m.user) != (surface, chat):
                _add(out, "reply-misplaced", f"m{i} ({m.surface} {m.user}) answered in "
                     f"{surface} {chat}")
    for m in o.msgs:
        name, detail = outcome.get((m.surface, m.platform_id), ("", ""))
        # "unconfirmed": killed while the reply was being sent, on a platform without an
        # idempotent send (Telegram): never resent, so it may not have arrived
        if name == "replied" and "unconfirmed" not in detail and not shown[m.id]:
            _add(out, "replied-unseen", f"m{m.id} ({m.surface} {m.user}): outcome replied "
                 f"({detail or 'delivered'}), no reply in the chat")


def check_rest(o: Observed, out: dict[str, list[str]]) -> None:
    got = sorted(_key(d) for d in o.dead)
    want = sorted((m.surface, m.platform_id) for m in o.msgs if m.poison)
    # each poison call kills the gateway: three of them must set it aside. A poison turn
    # that failed before reaching the model (a rate-limit cooldown) kills nothing and
    # may end with another outcome (check_outcomes still wants exactly one)
    killed = sum(1 for c in o.calls if c.mode == "poison")
    if got != want and (killed >= 3 or got):
        _add(out, "dead-letters", f"dead letters {got}, expected the poison {want} "
             f"(its turn reached the model {killed} times)")
    unresolved = (o.status.get("outcomes") or {}).get("unresolved")
    if unresolved != 0:
        _add(out, "unresolved", f"status outcomes.unresolved = {unresolved}")
    if o.metrics.get("tidegate_messages_without_outcome") != 0.0:
        _add(out, "unresolved", f"/metrics: {o.metrics}")
    live = _journal_live(o.status)
    if live != 0:
        _add(out, "unresolved", f"the intake journal holds {live} unfinished entries")


def check(o: Observed) -> dict[str, list[str]]:
    """Anomalies by kind (empty when the run kept every rule)."""
    out: dict[str, list[str]] = {}
    check_outcomes(o, out)
    check_chats(o, out)
    check_rest(o, out)
    return out
