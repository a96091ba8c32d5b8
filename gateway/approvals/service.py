"""The approval gate of every tool call and the approvals it waits for (docs/exec.md).

:meth:`Approvals.gate` is ``ToolContext.gate``: for ``exec`` it applies ``tools.exec``
(runtime/approvals/policy.py); on "ask" it sends one request to every approver
(prompts.py) and waits — the turn pauses, its lane keeps its order — until an approver
presses a button, an operator answers (``tidegate approvals``, the control API), or
``approval_timeout`` passes on the gateway's clock (a deny). The model gets a plain
result: the command's output when it ran, ``denied by <who>``, or ``timed out``.

Requests live in the approvals file (runtime/approvals/store.py): one still pending
after a restart stays answerable until it expires; its decision is used by the same
command when the session's turn asks again (the resumed turn), and an unanswered one
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
from gateway.approvals.prompts import close_prompts, parse_action, send_prompts
from gateway.routing import IdentityLinks, canonical_id
from runtime.approvals.match import exact_pattern
from runtime.approvals.policy import Verdict, exec_verdict
from runtime.approvals.store import ApprovalRequest, ApprovalStore

log = structlog.get_logger(__name__)

LOCAL_CHANNELS = frozenset({"cli", "webchat", "openai"})
"""The operator's own surfaces (behind the gateway token): their messages never taint."""


class Approvals:
    """The gateway's approvals (module docstring). ``gw`` is the Gateway."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.store = ApprovalStore(gw.state_dir)
        self._waiters: dict[str, asyncio.Future[ApprovalRequest]] = {}
        self._tasks: set[asyncio.Task] = set()

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Take button presses from every adapter that sends buttons, and settle the
        requests left pending by the previous run (expired now, or later)."""
        for ch in self.gw.channels:
            if hasattr(ch, "send_buttons"):
                ch.on_press = self.press
        for req in self.store.pending():
            self._spawn(self._expire_later(req))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _expire_later(self, req: ApprovalRequest) -> None:
        await self.gw.clock.sleep(max(0.0, req.expires_at - self.gw.clock.time()))
        if req.status == "pending" and req.id not in self._waiters:
            await self._settle(req, "expired", None)
            self.gw.scheduling.enqueue(
                req.session_key, f"The approval request {req.id} for `{req.command[:200]}` "
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
            v = exec_verdict(rules, command, self.store.patterns(ctx.agent_id), path=path,
                             cwd=str(ctx.workspace))
            if v.action == "deny":
                return self._deny(ctx, session_id, command, v.argv, v.reason)
            if v.action == "run" and not self._tainted(tool, args, ctx):
                return None
            tainted = v.action == "run"
            if tainted:  # allowlisted, but the turn is tainted: no "always" either
                v = Verdict("ask", self._taint_reason(ctx), None, v.binary)
            elif ctx.taint and self.gw.config.tools.taint.mode != "off":
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
        return await self.ask(ctx, session_id, command, v, rules, tool=tool)

    def _tainted(self, tool: str, args: dict[str, Any], ctx: Any) -> bool:
        """A side-effecting call in a tainted turn (``tools.taint``; ``message`` back to
        the turn's own chat is not a side effect here)."""
        if not ctx.taint or self.gw.config.tools.taint.mode == "off":
            return False
        if tool == "message" and not args.get("channel"):
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
                  rules: Any, tool: str = "exec") -> str | None:
        """Request an approval and wait for it (module docstring)."""
        req = self._reusable(ctx.session_key, command)
        if req is not None and req.status == "allowed":
            req.consumed = True  # decided while no turn waited (a restart)
            self.store.save()
            return None
        if req is None:
            req = await self._new_request(ctx, session_id, command, v, rules, tool)
        fut = self._waiters.setdefault(req.id, asyncio.get_running_loop().create_future())
        try:
            async with self.gw.clock.timeout(max(0.0, req.expires_at - self.gw.clock.time())):
                decided = await asyncio.shield(fut)
        except TimeoutError:
            await self._settle(req, "expired", None)
            return (f"timed out: nobody approved the {_what(tool)} within "
                    f"{rules.approval_timeout:g}s; it did not run")
        except asyncio.CancelledError:
            # a stopped turn: nobody waits any more; a gateway shutting down keeps the
            # request pending for the next start (module docstring)
            if req.status == "pending" and not self.gw.stopping:
                await self._settle(req, "expired", "turn stopped")
            raise
        finally:
            self._waiters.pop(req.id, None)
        if decided.status == "allowed":
            decided.consumed = True
            self.store.save()
            return None
        return f"denied by {decided.decided_by}: the {_what(tool)} did not run"

    def _reusable(self, session_key: str, command: str) -> ApprovalRequest | None:
        for r in self.store.requests.values():
            if (r.session_key == session_key and r.command == command and not r.consumed
                    and (r.status == "pending" or r.status == "allowed")
                    and r.expires_at > self.gw.clock.time()):
                return r
        return None

    async def _new_request(self, ctx: Any, session_id: str, command: str, v: Verdict,
                           rules: Any, tool: str) -> ApprovalRequest:
        now = self.gw.clock.time()
        req = ApprovalRequest(
            id=self.store.new_id(), agent_id=ctx.agent_id, session_key=ctx.session_key,
            session_id=session_id, tool=tool, command=command, argv=v.argv,
            binary=v.binary, reason=v.reason, requested_at=now,
            expires_at=now + rules.approval_timeout, approvers=list(rules.approvers))
        self.store.add(req)
        await send_prompts(self.gw, req, now)
        self.store.save()
        if not req.prompts:  # nobody can press a button: only the CLI/UI can answer
            log.error("approval_unreachable", approval_id=req.id, approvers=req.approvers,
                      hint="no approver could be messaged; answer with tidegate approvals")
        log.info("exec_approval_requested", approval_id=req.id, session_key=req.session_key,
                 command=command[:500], reason=v.reason, approvers=req.approvers,
                 prompts=len(req.prompts))
        self._record(session_id, "requested", {"id": req.id, "command": command,
                                               "argv": v.argv, "binary": v.binary,
                                               "reason": v.reason,
                                               "approvers": req.approvers})
        return req

    # -- decisions ---------------------------------------------------------------------
    async def decide(self, rid: str, choice: str, by: str) -> ApprovalRequest:
        """Apply ``choice`` (once | always | deny) by ``by`` to request ``rid``. Raises
        KeyError for an unknown id, ValueError when it is already decided (the message
        says how) or "always" is asked for a command that is not plain."""
        req = self.store.get(rid)
        if req is None:
            raise KeyError(rid)
        if req.status != "pending":
            raise ValueError(f"already {req.status}"
                             + (f" by {req.decided_by}" if req.decided_by else ""))
        if choice == "always":
            if req.argv is None:
                raise ValueError("only a plain command can be always allowed")
            path = os.environ.get("PATH")
            self.store.add_pattern(req.agent_id, exact_pattern(req.argv, path=path),
                                   by, self.gw.clock.time())
        await self._settle(req, "denied" if choice == "deny" else "allowed", by,
                           always=choice == "always")
        return req

    async def _settle(self, req: ApprovalRequest, status: str, by: str | None, *,
                      always: bool = False) -> None:
        req.status, req.decided_by, req.always = status, by, always
        req.decided_at = self.gw.clock.time()
        self.store.save()
        log.info("exec_approval_decided", approval_id=req.id, session_key=req.session_key,
                 decision=status, by=by, always=always)
        self._record(req.session_id, status, {"id": req.id, "command": req.command,
                                              "argv": req.argv, "by": by, "always": always})
        fut = self._waiters.get(req.id)
        if fut is not None and not fut.done():
            fut.set_result(req)
        await close_prompts(self.gw, req)

    async def press(self, press: ButtonPress) -> None:
        """A button press from a chat: only an approver's counts; anyone else gets a short
        answer only they see, and the refusal is logged."""
        parsed = parse_action(press.action)
        if parsed is None:
            return
        rid, choice = parsed
        req = self.store.get(rid)
        who = f"{press.channel}:{press.sender_id}"
        if req is None or not self.is_approver(req, press.channel, press.sender_id):
            log.warning("approval_press_refused", approval_id=rid, by=who,
                        reason="unknown request" if req is None else "not an approver")
            await _answer(press, "Only an approver can answer this request.")
            return
        try:
            await self.decide(rid, choice, who)
        except ValueError as exc:
            await _answer(press, f"Not changed: {exc}.")
            return
        await _answer(press, {"once": "Allowed once.", "always": "Always allowed.",
                              "deny": "Denied."}[choice])

    def sender_taint(self, agent_id: str, channel: str, sender_id: str | None) -> str | None:
        """Why a message taints its turn: from a chat platform, by a sender who is not an
        owner (``tools.taint.owners`` or the agent's approvers). Local surfaces (CLI,
        webchat, the OpenAI-compatible API: the gateway token) are the operator's; with no
        owners configured nobody can be told apart, and messages do not taint."""
        if channel in LOCAL_CHANNELS or self.gw.config.tools.taint.mode == "off":
            return None
        owners = (list(self.gw.config.tools.taint.owners)
                  + list(self.gw.config.agent(agent_id).tools.exec.approvers))
        if not owners or (sender_id and self._matches(owners, channel, sender_id)):
            return None
        return f"a message from {channel}:{sender_id} (not an owner)"

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


def _what(tool: str) -> str:
    return "command" if tool == "exec" else f"{tool} call"
