"""Intake: everything between an adapter's ``InboundMessage`` and the session's lane —
exactly-once check, access policy (before any model call), pairing, chat commands,
routing to an agent and session key (DESIGN.md steps 1-5).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from channels.access.activation import ActivationStore
from channels.access.pairing import PairingStore, PairingUnavailable
from channels.access.policy import check_access, group_dm_scope, sender_matches
from channels.base import ChannelEvent, InboundMessage
from channels.config import channel_debounce
from channels.inbound.dedupe import InboundDedupe, dedupe_key, refused_key
from channels.inbound.group_history import GroupHistory, conversation_of, with_history
from gateway.config.schema import Config
from gateway.inbound.albums import AlbumBuffer, album_key
from gateway.outbound.delivery import Deliverer
from gateway.routing import (
    BindingRule,
    IdentityLinks,
    Route,
    pick_agent,
    session_key_for,
)
from gateway.turns.commands import (
    COMMANDS,
    HELP_TEXT,
    LANE_COMMANDS,
    is_activation,
    parse_command,
    stop_reply,
)
from gateway.turns.work import CommandWork, UserWork
from runtime.clock import Clock
from runtime.lanes import LaneClosed, LaneManager

log = structlog.get_logger(__name__)
__all__ = ["HELP_TEXT", "LANE_COMMANDS", "Intake", "parse_command", "stop_reply"]  # turns/commands.py

@dataclass(slots=True)
class Routed:
    agent_id: str
    session_key: str
    route: Route


class Intake:
    """Turns inbound messages into lane work. ``access_config(channel, account)`` returns the
    AccessConfig of a platform account (None for trusted local channels)."""

    def __init__(self, *, config: Config, lanes: LaneManager, deliverer: Deliverer,
                 clock: Clock, dedupe: InboundDedupe | None, pairing: PairingStore | None,
                 access_config: Callable[[str, str], Any],
                 status_text: Callable[[str, str], str],
                 on_channel_event: Callable[..., None] | None = None,
                 bot_ids: Callable[[str, str], set[str]] | None = None) -> None:
        self.lanes = lanes
        self.deliverer = deliverer
        self.clock = clock
        self.dedupe = dedupe
        self.pairing = pairing
        self.access_config = access_config
        self.status_text = status_text
        self.on_channel_event = on_channel_event
        self.bot_ids = bot_ids
        self.usage_text: Callable[[str, str], Awaitable[str]] | None = None  # /usage
        self.on_inbound: Callable[[str, str], None] | None = None  # (channel, outcome)
        self.media: Any = None  # gateway/inbound/media.MediaIntake
        self.provenance: Any = None  # gateway/inbound/provenance.FileProvenance
        self.sees_images: Callable[[str, str], bool] = lambda agent, key: True
        # The intake journal (gateway/journal): platform messages are durable before
        # on_message returns, i.e. before the adapter acknowledges them to the platform.
        self.journal: Any = None
        self.outcomes: Any = None  # gateway/journal/recorder.py OutcomeRecorder
        self._held: list[tuple[str, UserWork]] | None = None
        self.resumable: set[str] | None = None  # journal ids at hold() (see hold)
        self.subagents_text: Callable[[str, str], str] | None = None
        self.memory_forget: Callable[..., Any] | None = None  # /forget (gateway/memory/forget.py)
        self._tasks: set[asyncio.Task] = set()
        self.albums = AlbumBuffer(clock, lambda: self.config.media.album_wait,
                                  lambda key, work: self._ready(key, work),
                                  journal=lambda: self.journal)
        self.group_history = GroupHistory()  # channels/inbound/group_history.py (issue 13)
        self.activation: ActivationStore | None = None  # /activation (channels/access/activation.py)
        self.apply_config(config)

    def apply_config(self, config: Config) -> None:
        """(Re)load routing settings (SIGHUP)."""
        self.config = config
        self.dm_scope = config.session.dm_scope
        self.links = IdentityLinks(config.session.identity_links)
        self.rules = [BindingRule(agent=b.agent, channel=b.match.channel,
                                  account=b.match.account, peer=b.match.peer,
                                  group=b.match.group, chat_type=b.match.chat_type)
                      for b in config.bindings]

    # -- routing -------------------------------------------------------------------------
    def route(self, msg: InboundMessage, agent_id: str | None = None) -> Routed:
        """Pick the agent and compose the session key for ``msg``."""
        peer = self.links.canonical(msg.channel, msg.peer_id)
        agent = agent_id or pick_agent(
            self.rules, self.config.default_agent(), channel=msg.channel,
            account=msg.account_id, peer=msg.peer_id, group=msg.group_id,
            chat_type=msg.chat_type)
        # groups.<id>.dm_scope: the sender's DM session under that scope, replies to the group
        cfg = self.access_config(msg.channel, msg.account_id)
        scope = group_dm_scope(msg, cfg)
        key = session_key_for(agent_id=agent, channel=msg.channel,
                              chat_type="dm" if scope else msg.chat_type, peer_id=peer,
                              group_id=msg.group_id, thread_id=msg.thread_id,
                              account_id=msg.account_id, dm_scope=scope or self.dm_scope,
                              dm_threads=bool(getattr(cfg, "thread_sessions", False)))
        to = msg.group_id if msg.chat_type != "dm" else msg.peer_id
        return Routed(agent, key, Route(channel=msg.channel, to=str(to),
                                        account=msg.account_id, thread=msg.thread_id))

    # -- platform messages ---------------------------------------------------------------
    async def on_message(self, msg: InboundMessage) -> str:
        """Adapter callback. Never raises; a turn runs in the background. Returns the
        outcome (see ``_handle``; ``rejected`` while stopping, ``failed`` on a bug)."""
        outcome = "failed"
        try:
            outcome = await self._handle(msg)
        except LaneClosed:
            outcome = "rejected"
            log.warning("message_rejected_shutting_down", channel=msg.channel)
        except Exception:
            log.exception("inbound_failed", channel=msg.channel, message_id=msg.message_id)
        if self.on_inbound is not None:
            self.on_inbound(msg.channel, outcome)
        return outcome

    def hold(self) -> None:
        """Accept (and journal) messages but queue none until ``release()``: at start,
        so resumed journal entries (``resumable``: those left by the last run) run before
        anything newer, and what arrives meanwhile (a RESUME replay) runs once, at release."""
        self._held, journal = [], getattr(self.journal, "journal", None)
        self.resumable = {e.id for e in journal.unfinished()} if journal else None

    def release(self) -> None:
        held, self._held = self._held or [], None
        for key, work in held:
            self._submit(key, work)

    async def _new(self, key: str | None) -> bool:
        """Mark ``key`` seen; False when it already was (a platform redelivery)."""
        return not key or self.dedupe is None or await self.dedupe.acheck_and_mark(key)

    async def _handle(self, msg: InboundMessage) -> str:
        """Returns the outcome: duplicate | pairing | denied | command | refused_media |
        album_gated | album | kept | held | queued."""
        key = dedupe_key(msg)
        hidden = refused_key(key) if key else None  # how a refused message is kept
        if key and self.dedupe is not None and (self.dedupe.seen(key)
                                                or self.dedupe.seen(hidden)):
            log.info("inbound_duplicate", channel=msg.channel, message_id=msg.message_id)
            return "duplicate"
        cfg = self.access_config(msg.channel, msg.account_id)
        if cfg is not None:
            bots = self.bot_ids(msg.channel, msg.account_id) if self.bot_ids else set()
            activation = self.activation.get(msg.channel, msg.account_id, msg.group_id) \
                if self.activation is not None else None
            decision = check_access(msg, cfg, bot_ids=bots, activation=activation,
                                    is_paired=self.pairing.is_approved if self.pairing else None)
            if decision.reason == "mention_required" and is_activation(msg.text):
                decision = dataclasses.replace(decision, allowed=True, action="run")  # no mention
            if decision.action == "pair":
                if await self._new(hidden):
                    await self._pair(msg)
                return "pairing"
            if not decision.allowed and msg.album_id and decision.reason == "mention_required":
                if not self.albums.is_open(album_key(msg)):  # maybe another part mentions us
                    await self.albums.hold_gated(album_key(msg), self.route(msg).session_key,
                                                 msg, key)
                    return "album_gated"
            elif not decision.allowed:
                await self._new(hidden)
                log.info("inbound_denied", channel=msg.channel, account=msg.account_id,
                         sender_id=msg.sender_id, chat_type=msg.chat_type,
                         group_id=msg.group_id, reason=decision.reason,
                         action=decision.action)
                if decision.action == "context" and not self._fetches_thread(msg, cfg):
                    # an allowed group's unmentioned message: context for the next turn
                    self.group_history.keep(msg, getattr(cfg, "group_history", 0))
                return "denied"
        outcome = await self._accept(msg, key)
        if msg.album_id:  # this part passed: parts held for a mention are accepted too
            for part, entry_id in self.albums.open(album_key(msg)):
                await self._accept(part, dedupe_key(part))
                self.albums.settle(entry_id)
        return outcome

    async def accept_held(self, msg: InboundMessage, entry_id: str) -> None:
        """Start-up: a held album part whose album had passed before the restart is
        accepted (downloaded, journaled) without waiting in the album buffer, so that
        the resume merges it into its album's turn (gateway/journal/resume.py)."""
        await self._accept(msg, dedupe_key(msg), buffer=False)
        self.albums.settle(entry_id)

    async def _accept(self, msg: InboundMessage, key: str | None, *,
                      buffer: bool = True) -> str:
        """After the access policy: commands, media, the journal, then the lane (or the
        album buffer; ``buffer=False``: journaled only, for the start-up resume)."""
        routed = self.route(msg)
        cmd = None if msg.album_id else parse_command(msg.text)
        if cmd and cmd[0] in COMMANDS:
            if await self._new(key):
                await self._command(cmd[0], routed, msg, cmd[1])
            return "command"
        text, media = msg.text, []
        if msg.media and self.media is not None:
            prepared = await self.media.prepare(
                msg, self.config.workspace_for(routed.agent_id),
                vision=self.sees_images(routed.agent_id, routed.session_key))
            for notice in prepared.notices:
                await self.deliverer.send(routed.route, notice, kind="notice")
            if not prepared.text and not prepared.refs:
                return "refused_media"  # every file refused, nothing else said: sender told
            text, media = prepared.text, [r.to_dict() for r in prepared.refs]
            if self.provenance is not None:  # who sent it: reading it later may taint
                for ref in prepared.refs:
                    self.provenance.record(routed.agent_id, ref.path, msg.channel,
                                           msg.sender_id, ref.sha256)
        if msg.chat_type != "dm":
            text = with_history(self.group_history.take(msg), text)
        work = UserWork(agent_id=routed.agent_id, text=text, channel=msg.channel,
                        account_id=msg.account_id, chat_type=msg.chat_type,
                        sender_id=msg.sender_id, sender_name=msg.sender_name,
                        message_id=msg.message_id, received_at=msg.received_at or None,
                        route=routed.route, media=media, group_id=msg.group_id,
                        album=album_key(msg) if msg.album_id else None)
        if self.journal is not None and work.route is not None:
            if not await self.journal.accept(routed.session_key, work, key,
                                             mark_seen=lambda: self._new(key)):
                return "duplicate"
        elif not await self._new(key):
            return "duplicate"
        if not buffer and self.resumable is not None and work.journal_id:
            self.resumable.add(work.journal_id)  # the start-up resume's own part
        if work.album is not None and not buffer:
            return "album"
        if work.album is not None:  # journaled: now it may wait for the album's other parts
            parts = self.albums.add(work.album, routed.session_key, work)
            log.info("inbound_album_part", channel=msg.channel, album=work.album,
                     session_key=routed.session_key, message_id=msg.message_id,
                     entry_id=work.journal_id, parts=parts)
            return "album"
        return self._ready(routed.session_key, work)

    def _ready(self, session_key: str, work: UserWork) -> str:
        """Hand accepted work to its lane: ``kept`` (stopping; the journal keeps it),
        ``held`` (start-up resume still running) or ``queued``."""
        if self.lanes.closed and work.journal_id is not None:
            # Stopping: the journal keeps it for the next start.
            log.warning("inbound_kept_for_restart", channel=work.channel,
                        session_key=session_key, message_id=work.message_id,
                        entry_id=work.journal_id)
            return "kept"
        if self._held is not None:
            self._held.append((session_key, work))
            return "held"
        self._submit(session_key, work)
        return "queued"

    def close(self) -> None:
        """Shutdown: albums still waiting stay in the journal for the next start."""
        self.albums.close(journaled=self.journal is not None)

    def _submit(self, session_key: str, work: UserWork) -> None:
        fut = self.lanes.submit(session_key, work, idle_debounce=channel_debounce(
            self.config.channels, work.channel, work.account_id))
        log.info("inbound_queued", channel=work.channel, session_key=session_key,
                 run_id=work.run_id, message_id=work.message_id, entry_id=work.journal_id)
        if self.journal is not None:
            self.journal.watch(work, fut)
        if self.outcomes is not None:
            self.outcomes.watch(work, session_key, fut)
        fut.add_done_callback(_log_failure)

    def _fetches_thread(self, msg: InboundMessage, cfg: Any) -> bool:
        """A thread reply whose platform gives the thread's first turn the thread so far
        (Slack ``thread_history``): not kept twice."""
        if not msg.thread_id or conversation_of(msg)[3] == "":
            return False
        ch = self.deliverer.find(msg.channel, msg.account_id)
        return hasattr(ch, "thread_history") and getattr(cfg, "thread_history", 0) > 0

    async def _pair(self, msg: InboundMessage) -> None:
        assert self.pairing is not None
        try:
            req = self.pairing.request(msg.channel, msg.account_id, msg.sender_id,
                                       msg.sender_name)
        except PairingUnavailable:  # reported once by the store; the sender waits
            log.info("inbound_denied", channel=msg.channel, sender_id=msg.sender_id,
                     reason="pairing_unavailable")
            return
        log.info("inbound_denied", channel=msg.channel, sender_id=msg.sender_id,
                 reason="pairing_required", new_code=req.is_new)
        if req.is_new:
            text = (f"Hi! I don't know you yet. Your pairing code is {req.code}.\n"
                    f"Ask the owner to run: tidegate pairing approve {msg.channel} {req.code}")
            await self.deliverer.send(Route(msg.channel, msg.peer_id, msg.account_id),
                                      text, kind="notice", answers=msg.message_id)

    async def _command(self, name: str, routed: Routed, msg: InboundMessage,
                       args: str = "") -> None:
        """Answer a command now with a notice, or queue it on the session's lane (/new,
        /reset, /model...). The notice names the command message it ``answers``."""
        key = routed.session_key
        if name == "help":
            text = HELP_TEXT
        elif name == "usage" and self.usage_text is not None:
            text = await self.usage_text(routed.agent_id, key)
        elif name == "status":
            text = self.status_text(routed.agent_id, key)
        elif name == "stop":  # acts now, not queued behind the turn it stops
            arg = (parse_command(msg.text) or ("", ""))[1].strip().lower()
            text = stop_reply(self.lanes.abort(key, drop_queued=arg == "all"))
        elif name == "activation":
            text = self._activation(msg, args)
        elif name == "forget":
            text = (await self.memory_forget(routed.agent_id, msg, args)
                    if self.memory_forget else "Memory is not available.")
        elif name == "subagents":
            arg = (parse_command(msg.text) or ("", ""))[1]
            text = (self.subagents_text(key, arg) if self.subagents_text
                    else "Subagents are not available.")
        else:
            fut = self.lanes.submit(key, CommandWork(
                agent_id=routed.agent_id, command=name, route=routed.route,
                channel=msg.channel, args=args, answers=msg.message_id), mergeable=False)
            fut.add_done_callback(_log_failure)
            return
        await self.deliverer.send(routed.route, text, kind="notice", answers=msg.message_id)

    def _activation(self, msg: InboundMessage, args: str) -> str:
        """``/activation mention|always`` in a group, by an owner: a sender listed in
        ``allow_from`` (not via ``*``) or approved in the pairing store."""
        mode = args.strip().lower()
        if msg.chat_type == "dm" or not msg.group_id or self.activation is None:
            return "/activation works in groups."
        cfg = self.access_config(msg.channel, msg.account_id)
        owners = [a for a in (getattr(cfg, "allow_from", None) or []) if a.strip() != "*"]
        paired = self.pairing is not None and self.pairing.is_approved(
            msg.channel, msg.account_id, msg.sender_id)
        current = self.activation.get(msg.channel, msg.account_id, msg.group_id)
        if mode not in ("mention", "always"):
            return (f"Activation here: {current or 'as configured'}. "
                    "Use /activation mention or /activation always.")
        if not (sender_matches(msg, owners) or paired):
            log.info("command_refused", command="activation", channel=msg.channel,
                     sender_id=msg.sender_id, group_id=msg.group_id, reason="not_owner")
            return "Only the bot's owner or allowlisted senders can change activation."
        try:
            self.activation.set(msg.channel, msg.account_id, msg.group_id, mode)
        except OSError as exc:
            log.error("activation_write_failed", error=str(exc), group_id=msg.group_id)
            return "Could not save the activation mode."
        log.info("group_activation_set", channel=msg.channel, group_id=msg.group_id,
                 mode=mode, sender_id=msg.sender_id)
        return ("I answer every message here now." if mode == "always"
                else "I answer here only when mentioned now.")

    async def on_event(self, event: ChannelEvent) -> None:
        """Adapter callback for reactions/edits/deletions/pins: a ride-along system event
        for the conversation's session (never starts a turn)."""
        try:
            msg = InboundMessage(channel=event.channel, text="", sender_id=event.sender_id or "",
                                 chat_type=event.chat_type, account_id=event.account_id,
                                 peer_id=event.peer_id or event.sender_id or "",
                                 group_id=event.group_id, thread_id=event.thread_id,
                                 mentions_bot=True)  # events need no mention, only access
            cfg = self.access_config(msg.channel, msg.account_id)
            if cfg is not None:
                bots = self.bot_ids(msg.channel, msg.account_id) if self.bot_ids else set()
                decision = check_access(msg, cfg, bot_ids=bots, is_paired=self.pairing
                                        .is_approved if self.pairing else None)
                if not decision.allowed:  # refused senders never reach the model
                    log.info("channel_event_denied", channel=event.channel, kind=event.kind,
                             sender_id=event.sender_id, reason=decision.reason)
                    return
            routed = self.route(msg)
            if self.on_channel_event is not None:
                # The adapter's text carries user-controlled content (an edited message):
                # JSON-quote it so it cannot pose as gateway lines in the trusted section.
                text = f"{event.kind}: {json.dumps(event.text, ensure_ascii=False)}"
                # source "<channel>.<kind>", e.g. "slack.reaction" (scheduler/system_events)
                # who caused it: a non-owner's edit taints the turn that drains it
                self.on_channel_event(routed.session_key, text,
                                      f"{event.channel}.{event.kind}",
                                      sender=(routed.agent_id, event.channel, event.sender_id))
        except Exception:
            log.exception("channel_event_failed", channel=event.channel, kind=event.kind)


def _log_failure(fut: asyncio.Future) -> None:
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is not None:
        log.error("turn_failed", error=str(exc), error_type=type(exc).__name__)
