"""The approval gate of every tool call and the approvals it waits for (docs/exec.md).

:meth:`Approvals.gate` is ``ToolContext.gate``: for ``exec`` it applies ``tools.exec``
(runtime/approvals/policy.py); on "ask" it sends one request to every approver
(prompts.py) and waits — the turn pauses, its lane keeps its order — until an approver
presses a button, an operator answers (``tidegate approvals``, the control API), or
``approval_timeout`` passes on the gateway's clock (a deny). The model gets a plain
result: the command's output when it ran, ``denied by <who>``, or ``timed out``.

Requests live in the approvals file (runtime/approvals/store.py), or in PostgreSQL on
replicas (gateway/cluster/approvals.py: any replica decides a request, exactly once, and
the replica whose turn waits resumes it). One still pending after a restart stays
answerable until it expires; its decision is used only by the turn that asked (same
run id: that turn resumed after the restart) asking for the same command — never by
another turn of the session — and an unanswered one
expires as a deny with a notice to the approvers and a system event for its session.
Every request and decision is a SYSTEM_EVENT in the session's timeline (``kind``
``exec_approval``) and a log line.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import structlog

from channels.base import ButtonPress
from gateway.approvals.prompts import close_prompts, parse_action, send_prompts, too_long
from gateway.routing import IdentityLinks, canonical_id, is_listed
from runtime.approvals.match import exact_pattern
from runtime.approvals.policy import Verdict, exec_verdict
from runtime.approvals.store import ApprovalRequest, ApprovalStore, FileApprovals

RECORDED_CAP = 4096  # decided request ids remembered against a second notification
log = structlog.get_logger(__name__)

LOCAL_CHANNELS = frozenset({"cli", "webchat", "openai"})
"""The operator's own surfaces (behind the gateway token): their messages never taint."""


class Approvals:
    """The gateway's approvals (module docstring). ``gw`` is the Gateway. ``records``:
    where requests and patterns live — this host's approvals file
    (runtime/approvals/store.py ``FileApprovals``), or PostgreSQL on replicas
    (gateway/cluster/approvals.py, which sets it)."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.store = ApprovalStore(gw.state_dir)
        self.records: Any = FileApprovals(self.store)
        self._waiters: dict[str, asyncio.Future[ApprovalRequest]] = {}
        self._settling: set[str] = set()  # decided here: the notification is ours
        # decisions this replica recorded: a NOTIFY and the tick's look can both arrive,
        # the second after the turn stopped waiting (insertion-ordered, capped)
        self._recorded: dict[str, None] = {}
        self._tasks: set[asyncio.Task] = set()

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Take button presses from every adapter that sends buttons, and settle the
        requests left pending by the previous run (expired now, or later)."""
        for ch in self.gw.channels:
            if hasattr(ch, "send_buttons"):
                ch.on_press = self.press
        for req in await self.records.mine():
            self.adopted(req)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def adopted(self, req: ApprovalRequest) -> None:
        """``req`` is pending and nobody here waits for it: expire it when its time is up
        unless it is answered (or a turn takes it up) first."""
        self.spawn(self._expire_later(req))

    def waiting(self) -> list[str]:
        """Ids of the requests a turn here waits for."""
        return list(self._waiters)

    async def _expire_later(self, req: ApprovalRequest) -> None:
        await self.gw.clock.sleep(max(0.0, req.expires_at - self.gw.clock.time()))
        if req.id in self._waiters:
            return  # a turn took it up: its own timeout decides
        won = await self._settle(req.id, "expired", None, mine_only=True)
        if won is not None:
            self.gw.scheduling.enqueue(
                won.session_key, f"The approval request {won.id} for `{won.command[:200]}` "
                "expired unanswered (the gateway restarted while it waited): the command "
                "did not run.", "exec")

    # -- the gate ----------------------------------------------------------------------
    async def gate(self, tool: str, args: dict[str, Any], ctx: Any,
                   session_id: str) -> str | None:
        """``ToolContext.gate``: None = run the tool; else the result the model gets."""
        rules = self.gw.config.agent(ctx.agent_id).tools.exec
        command = args.get("command")
        if tool == "exec" and isinstance(command, str) and command:
            path = (ctx.extra.get("exec_env") or {}).get("PATH") or os.environ.get("PATH")
            v = exec_verdict(rules, command, await self.records.patterns(ctx.agent_id), path=path,
                             cwd=str(ctx.workspace))
            if v.action == "deny":
                return self._deny(ctx, session_id, command, v.argv, v.reason)
            if v.action == "run" and not self._tainted(tool, args, ctx):
                return None
            tainted = v.action == "run"
            if tainted:  # allowlisted, but the turn is tainted: no "always" either
                v = Verdict("ask", self._taint_reason(ctx), None, v.binary)
            elif ctx.taint and self.gw.config.tools.taint.mode != "off":
                tainted = True  # a miss too: refused under tools.taint.mode deny
                v = Verdict("ask", f"{v.reason}; {self._taint_reason(ctx)}", v.argv,
                            v.binary)
        elif self._tainted(tool, args, ctx):
            tainted = True
            command = f"{tool} {json.dumps(args, ensure_ascii=False)[:1000]}"
            v = Verdict("ask", self._taint_reason(ctx))
        else:
            return None
        if tainted and self.gw.config.tools.taint.mode == "deny":
            return self._deny(ctx, session_id, command, v.argv,
                              f"{v.reason}; side-effecting tools are refused after that "
                              "(tools.taint.mode: deny)")
        if not rules.approvers:
            return self._deny(ctx, session_id, command, v.argv, f"{v.reason}, and no "
                              "approvers are configured (tools.exec.approvers)")
        return await self.ask(ctx, session_id, command, v, rules, tool=tool,
                              tainted=bool(ctx.taint)
                              and self.gw.config.tools.taint.mode != "off")

    def _tainted(self, tool: str, args: dict[str, Any], ctx: Any) -> bool:
        """A side-effecting call in a tainted turn (``tools.taint``; ``message`` back to
        the turn's own chat is not a side effect here)."""
        if not ctx.taint or self.gw.config.tools.taint.mode == "off":
            return False
        if tool == "message" and not args.get("channel"):
            return False
        if tool == "memory_write" and _scoped_write(args, ctx):
            return False
        return self.gw.tools.side_effecting(tool)

    @staticmethod
    def _taint_reason(ctx: Any) -> str:
        return "the turn is tainted by " + "; ".join(dict.fromkeys(ctx.taint))

    def _deny(self, ctx: Any, session_id: str, command: str, argv: list[str] | None,
              reason: str) -> str:
        log.warning("exec_denied", session_key=ctx.session_key, agent=ctx.agent_id,
                    command=command[:500], reason=reason)
        self._record(session_id, "denied", {"command": command, "argv": argv,
                                            "reason": reason, "by": "policy"})
        return f"denied: {reason}; it did not run"

    async def ask(self, ctx: Any, session_id: str, command: str, v: Verdict,
                  rules: Any, tool: str = "exec", tainted: bool = False) -> str | None:
        """Request an approval and wait for it (module docstring). ``tainted``: the turn
        is tainted; the request can then only be allowed once or denied."""
        req = await self.records.reusable(ctx.session_key, command, self.gw.clock.time(),
                                          str(ctx.extra.get("run_id") or ""))
        if req is not None and req.status == "allowed":
            if await self.records.consume(req.id):  # decided while no turn waited
                return None
            req = None
        if req is None:
            req = await self._new_request(ctx, session_id, command, v, rules, tool, tainted)
        fut = self._waiters.setdefault(req.id, asyncio.get_running_loop().create_future())
        try:
            if req.status != "pending":  # decided between the look-up and the wait
                await self.notified(req.id)
            async with self.gw.clock.timeout(max(0.0, req.expires_at - self.gw.clock.time())):
                decided = await asyncio.shield(fut)
        except TimeoutError:
            decided = await self._settle(req.id, "expired", None)
            if decided is None:  # answered at the last moment (elsewhere)
                decided = await self.records.get(req.id) or req
        except asyncio.CancelledError:
            # a stopped turn: nobody waits any more; a gateway shutting down keeps the
            # request pending for the next start (module docstring)
            if not self.gw.stopping:
                await self._settle(req.id, "expired", "turn stopped")
            raise
        finally:
            self._waiters.pop(req.id, None)
        if decided.status == "allowed":
            await self.records.consume(decided.id)
            return None
        if decided.status == "expired":
            return (f"timed out: nobody approved the {_what(tool)} within "
                    f"{rules.approval_timeout:g}s; it did not run")
        return f"denied by {decided.decided_by}: the {_what(tool)} did not run"

    async def _new_request(self, ctx: Any, session_id: str, command: str, v: Verdict,
                           rules: Any, tool: str, tainted: bool) -> ApprovalRequest:
        now = self.gw.clock.time()
        req = ApprovalRequest(
            id=self.store.new_id(), agent_id=ctx.agent_id, session_key=ctx.session_key,
            session_id=session_id, tool=tool, command=command, argv=v.argv,
            binary=v.binary, reason=v.reason, requested_at=now,
            expires_at=now + rules.approval_timeout, approvers=list(rules.approvers),
            run_id=str(ctx.extra.get("run_id") or ""), tainted=tainted,
            runs="" if tool != "exec" else
            "host" if ctx.extra.get("sandbox") is None else "sandbox")
        await self.records.add(req)
        # in the timeline before anyone can see it: a decision is always recorded after it
        self._record(session_id, "requested", {"id": req.id, "command": command,
                                               "argv": v.argv, "binary": v.binary,
                                               "reason": v.reason,
                                               "approvers": req.approvers})
        # waited for from now on: a press while the prompts go out resumes the turn
        self._waiters[req.id] = asyncio.get_running_loop().create_future()
        await send_prompts(self.gw, req, now)
        await self.records.save(req)
        decided = await self.records.get(req.id)
        if decided is not None and decided.status != "pending":
            # pressed while the prompts went out: whoever decided saw no prompts to close
            await close_prompts(self.gw, decided)
        if not req.prompts:  # nobody can press a button: only the CLI/UI can answer
            log.error("approval_unreachable", approval_id=req.id, approvers=req.approvers,
                      hint="no approver could be messaged; answer with tidegate approvals")
        log.info("exec_approval_requested", approval_id=req.id, session_key=req.session_key,
                 command=command[:500], reason=v.reason, approvers=req.approvers,
                 prompts=len(req.prompts))
        return req

    # -- decisions ---------------------------------------------------------------------
    async def decide(self, rid: str, choice: str, by: str) -> ApprovalRequest:
        """Apply ``choice`` (once | always | deny) by ``by`` to request ``rid``. Raises
        KeyError for an unknown id, ValueError when it is already decided (the message
        says how) or "always" is asked for a request of a tainted turn or without a stored
        argv (not one plain command, shell-expanded words: its reason says which)."""
        req = await self.records.get(rid)
        if req is None:
            raise KeyError(rid)
        pattern = None
        if req.status == "pending" and choice == "always":
            if req.tainted:  # the model may be acting for the untrusted content
                raise ValueError("it cannot be always allowed: the turn is tainted (allow "
                                 f"it once or deny it); {req.reason}")
            if req.argv is None:
                raise ValueError(f"it cannot be always allowed: {req.reason}")
            pattern = exact_pattern(req.argv, path=os.environ.get("PATH"))
        won = None
        if req.status == "pending":
            won = await self._settle(rid, "denied" if choice == "deny" else "allowed", by,
                                     always=choice == "always", pattern=pattern)
        if won is None:  # decided before (possibly a moment ago, on another replica)
            req = await self.records.get(rid) or req
            raise ValueError(f"already {req.status}"
                             + (f" by {req.decided_by}" if req.decided_by else ""))
        return won

    async def _settle(self, rid: str, status: str, by: str | None, *, always: bool = False,
                      pattern: str | None = None,
                      mine_only: bool = False) -> ApprovalRequest | None:
        """Decide pending request ``rid`` (None when it was not pending any more), then
        resume its turn if it waits here and replace the approvers' buttons."""
        self._settling.add(rid)
        try:
            req = await self.records.settle(rid, status, by, self.gw.clock.time(),
                                            always=always, pattern=pattern,
                                            mine_only=mine_only)
            if req is None:
                return None
            log.info("exec_approval_decided", approval_id=rid, session_key=req.session_key,
                     decision=status, by=by, always=always)
            if req.replica == self.records.replica:
                self._resume(req)
        finally:
            self._settling.discard(rid)
        await close_prompts(self.gw, req)
        return req

    async def notified(self, rid: str) -> None:
        """Request ``rid`` was decided on another replica (NOTIFY, or the tick's look):
        when it is this replica's, the decision is recorded and the turn waiting here, if
        any, resumes."""
        if rid in self._settling:
            return
        req = await self.records.get(rid)
        if req is not None and req.status != "pending" and \
                req.replica == self.records.replica:
            self._resume(req)

    def _resume(self, req: ApprovalRequest) -> None:
        """Record the decision in the session's timeline and wake its waiting turn."""
        fut = self._waiters.get(req.id)
        if (fut is not None and fut.done()) or req.id in self._recorded:
            return  # resumed already
        self._recorded[req.id] = None
        if len(self._recorded) > RECORDED_CAP:
            del self._recorded[next(iter(self._recorded))]
        self._record(req.session_id, req.status, {"id": req.id, "command": req.command,
                                                  "argv": req.argv, "by": req.decided_by,
                                                  "always": req.always})
        if fut is not None:
            fut.set_result(req)

    async def press(self, press: ButtonPress) -> None:
        """A button press from a chat: only an approver's counts; anyone else gets a short
        answer only they see, and the refusal is logged."""
        parsed = parse_action(press.action)
        if parsed is None:
            return
        rid, choice = parsed
        req = await self.records.get(rid)
        who = f"{press.channel}:{press.sender_id}"
        if req is None or not self.is_approver(req, press.channel, press.sender_id):
            log.warning("approval_press_refused", approval_id=rid, by=who,
                        reason="unknown request" if req is None else "not an approver")
            await _answer(press, "Only an approver can answer this request.")
            return
        if choice != "deny" and too_long(req):  # no such button was sent (prompts.py)
            log.warning("approval_press_refused", approval_id=rid, by=who,
                        reason="command too long to show in a chat")
            await _answer(press, "Too long to show in a chat: allow it with `tidegate "
                          f"approvals allow {rid}`, which shows it whole.")
            return
        try:
            await self.decide(rid, choice, who)
        except ValueError as exc:  # decided already, or "always" for a tainted request
            log.warning("approval_press_refused", approval_id=rid, by=who, choice=choice,
                        reason=str(exc))
            await _answer(press, f"Not changed: {exc}.")
            return
        await _answer(press, {"once": "Allowed once.", "always": "Always allowed.",
                              "deny": "Denied."}[choice])

    def sender_taint(self, agent_id: str, channel: str, sender_id: str | None) -> str | None:
        """Why a message taints its turn: from a chat platform, by a sender who is not an
        owner (:meth:`owners`; identity links apply). Local surfaces (CLI,
        webchat, the OpenAI-compatible API: the gateway token) are the operator's; with no
        owners configured nobody can be told apart, and messages do not taint. A webhook
        (channel ``webhook``) always taints: its body comes from outside."""
        if channel in LOCAL_CHANNELS or self.gw.config.tools.taint.mode == "off":
            return None
        if channel == "webhook":  # a body from outside, whoever signed it (gateway/hooks)
            return f"webhook {sender_id} (content from outside the gateway)"
        owners = self.owners(agent_id)
        links = IdentityLinks(self.gw.config.session.identity_links)
        if not owners or is_listed(links, owners, channel, sender_id):
            return None
        return f"a message from {channel}:{sender_id} (not an owner)"

    def stranger(self, agent_id: str, channel: str, sender_id: str | None) -> str | None:
        """``channel:sender_id`` when a message from them is not an owner's: from a chat
        platform or a webhook, by a sender not among :meth:`owners` (identity links
        apply; with no owners configured nobody on a chat platform is one). None for the
        local surfaces (the operator's) and for owners. Unlike :meth:`sender_taint`, it
        does not depend on ``tools.taint``: sandbox mode non-main sandboxes a stranger's
        commands even in the main session (docs/exec.md)."""
        if channel in LOCAL_CHANNELS:
            return None
        links = IdentityLinks(self.gw.config.session.identity_links)
        if channel != "webhook" and sender_id and is_listed(
                links, self.owners(agent_id), channel, sender_id):
            return None
        return f"{channel}:{sender_id or '?'}"

    def owners(self, agent_id: str) -> list[str]:
        """The agent's owners, one list: ``agents.<id>.owners`` (who writes the shared
        memory), ``tools.taint.owners`` and the agent's ``tools.exec.approvers``."""
        agent = self.gw.config.agent(agent_id)
        return (list(agent.owners) + list(self.gw.config.tools.taint.owners)
                + list(agent.tools.exec.approvers))

    def is_approver(self, req: ApprovalRequest, channel: str, sender_id: str) -> bool:
        """Whether ``channel``/``sender_id`` is one of ``req``'s approvers (identity links
        apply: the approver's other ids count as theirs)."""
        return self._matches(req.approvers, channel, sender_id)

    def _matches(self, ids: list[str], channel: str, sender_id: str) -> bool:
        links = IdentityLinks(self.gw.config.session.identity_links)
        mine = links.canonical(channel, sender_id)
        for a in ids:
            ch, _, aid = a.partition(":")
            if ch == channel.lower() and canonical_id(ch, aid) == canonical_id(ch, sender_id):
                return True
            theirs = links.canonical(ch, aid)
            if theirs != aid and theirs == mine:
                return True
        return False

    def _record(self, session_id: str, event: str, content: dict[str, Any]) -> None:
        if self.gw.recorder is not None and session_id:
            self.gw.recorder(session_id, "SYSTEM_EVENT",
                             {"kind": "exec_approval", "event": event,
                              "at": self.gw.clock.time(), **content})


async def _answer(press: ButtonPress, text: str) -> None:
    if press.answer is not None:
        try:
            await press.answer(text)
        except Exception as exc:  # noqa: BLE001 - the decision stands
            log.warning("approval_answer_failed", channel=press.channel, error=str(exc)[:200])


def _scoped_write(args: dict[str, Any], ctx: Any) -> bool:
    """Whether a ``memory_write`` can only reach the sender's own or the group's scope
    (a non-owner's: the tool itself refuses them the agent scope, logged), which a tainted
    turn may still write: nobody else reads those entries."""
    hub = ctx.extra.get("memory")
    if hub is None:
        return False
    asker = hub.asker(ctx.agent_id, ctx.scope)
    if asker.operator:
        return False
    return not asker.writes_agent or args.get("scope") in ("user", "group")


def _what(tool: str) -> str:
    return "command" if tool == "exec" else f"{tool} call"
