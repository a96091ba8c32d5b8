"""What the gateway queues on a session's lane: user messages, commands and synthetic
(heartbeat / cron / system) turns. A lane batch is always of one kind; only user messages
merge (queue modes collect/steer/interrupt), and only those of one reply route and one
sender (:func:`reply_route`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.routing import IdentityLinks, Route, canonical_sender
from runtime.ids import unique_hex


def new_run_id() -> str:
    return unique_hex(12)


@dataclass(slots=True)
class UserWork:
    """One user message for a session. ``route`` is where the reply goes (None: the caller
    waits for the result, as the CLI, webchat and OpenAI-compatible API do).
    ``journal_id``: its intake-journal entry (platform messages); ``resume``: None, or
    ``rerun``/``continue`` when it is resumed after a crash (gateway/journal/resume.py).
    A merged album keeps the first part's entry in ``journal_id`` and the others in
    ``album_parts``."""

    agent_id: str
    text: str
    channel: str
    account_id: str = "default"
    chat_type: str = "dm"
    sender_id: str | None = None
    sender_name: str | None = None
    message_id: str | None = None
    received_at: float | None = None
    route: Route | None = None
    run_id: str = field(default_factory=new_run_id)
    media: list[dict] = field(default_factory=list)  # MediaRef dicts (JSON: survives restart)
    journal_id: str | None = None
    resume: str | None = None
    stream: bool = False  # someone consumes the reply's text deltas: call the model streaming
    group_id: str | None = None
    album: str | None = None  # album key (gateway/inbound/albums.py): its parts merge into one turn
    album_parts: list[str] = field(default_factory=list)  # other parts' journal entries
    album_messages: list[str | None] = field(default_factory=list)  # their message ids
    outcome: str | None = None  # its recorded outcome (gateway/journal/recorder.py), once known
    # OpenAI API callers' own tools (runtime/turn/client_tools.py): {"name", "description",
    # "parameters"} each, and their results for the last turn's calls {"tool_call_id", "content"}
    client_tools: list[dict] = field(default_factory=list)
    tool_results: list[dict] = field(default_factory=list)
    # what tainted the turn before a restart cut it (its journal entry's ``taint``): the
    # re-run starts tainted (not stored in the journal's work: the entry keeps it)
    tainted_by: list[str] = field(default_factory=list)
    # a CLI/webchat/API message's ``local`` journal record (gateway/journal/local.py): its
    # outcome row carries this id, and a process death before it is found at the next start
    local_id: str | None = None


def transcript_id(work: UserWork) -> str | None:
    """The id a user message carries in the transcript (``messageId``): the platform's
    message id, or for a message without one (CLI, webchat, OpenAI API) its run id, so a
    turn re-run after a takeover finds its message there and does not write it twice."""
    return work.message_id or (f"run-{work.run_id}" if work.journal_id else None)


def reply_route(payload: Any, links: IdentityLinks | None = None
                ) -> tuple[str | None, ...] | None:
    """The lane merge key of ``payload`` (runtime/lanes.py ``merge_key``): where its reply
    goes and who sent it. A platform message's is its route (channel, account, chat,
    thread) and its sender's canonical id (``gateway.routing.canonical_sender``, with
    ``links`` applied: one person's linked ids count as one sender), so the messages of
    two members of a group never share a turn (a turn acts for one sender: memory scope,
    owner checks, taint). A message whose caller awaits the answer itself (CLI, webchat,
    OpenAI-compatible API: no route) has a key of its own (its run id), so it never shares
    a turn with another message. None for anything else (commands and synthetic turns
    never merge anyway)."""
    if not isinstance(payload, UserWork):
        return None
    r = payload.route
    if r is None:
        return ("caller", payload.run_id)
    sender = canonical_sender(links or _NO_LINKS, payload.channel, payload.sender_id) \
        if payload.sender_id else None
    return ("route", r.channel, r.account, r.to, r.thread, sender)


_NO_LINKS = IdentityLinks()


@dataclass(slots=True)
class CommandWork:
    """A session command that must run in order with the session's turns (/new, /reset,
    /end)."""

    agent_id: str
    command: str
    route: Route | None = None
    channel: str = "cli"
    run_id: str = field(default_factory=new_run_id)
    args: str = ""  # what followed the command word (/model <ref>)
    journal_id: str | None = None  # replicas: its cluster_work row (gateway/cluster/commands.py)
    answers: str | None = None  # the command message's id: its notice answers it


@dataclass(slots=True)
class SyntheticWork:
    """A turn the gateway starts itself (trigger ``heartbeat``, ``cron`` or ``system``).

    ``hold``: keep the turn's transcript lines in memory until ``decide(result)`` says
    whether to commit them (True) or drop them (False) — used by the heartbeat so an
    ack-only beat leaves no trace. ``activity`` is always False: such turns never refresh
    or roll a session. ``fresh_session``: start a new session id under the key before the
    turn (isolated cron runs: every run has a fresh context, DESIGN.md "Scheduler").
    ``tool_scope`` narrows the tools (subagent runs, sessions_send). ``still_due``
    (replicas: a cron run's occurrence): awaited once the turn has its session's lane;
    False means another replica took the run over meanwhile and it does not run here.
    ``tainted_by``: what taints the turn from its start (a subagent spawned by a tainted
    turn, a ``sessions_send`` from one; docs/exec.md "Tainted turns").
    """

    agent_id: str
    trigger: str
    prompt: str
    model: str | None = None
    hold: bool = False
    decide: Callable[[object], bool] | None = None
    timeout: float | None = None
    fresh_session: bool = False
    run_id: str = field(default_factory=new_run_id)
    environment: dict[str, str] = field(default_factory=dict)
    tool_scope: Any = None  # runtime.tools.policy.ToolScope; None: the agent's default
    still_due: Callable[[], Awaitable[bool]] | None = None
    tainted_by: list[str] = field(default_factory=list)  # untrusted input behind the turn


def turn_lanes(gw: Any) -> Any:
    """Where the gateway's own turns (:class:`SyntheticWork`) are submitted: the intake's
    lanes — on replicas the cluster's, which run them under the session's lane lease
    (gateway/cluster/synthetic.py) — else the gateway's LaneManager."""
    intake = getattr(gw, "intake", None)
    return getattr(intake, "lanes", None) or gw.lanes
