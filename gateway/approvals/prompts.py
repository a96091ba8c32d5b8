"""The messages an approval request sends: to every approver, with native buttons where
the adapter has them (channels/base.py ``ButtonChannel``: Telegram inline keyboard...),
else as plain text naming the CLI command; and their update once decided."""

from __future__ import annotations

from typing import Any

import structlog

from channels.base import Button
from gateway.routing import Route
from runtime.approvals.store import ApprovalRequest
from runtime.clock import format_elapsed

log = structlog.get_logger(__name__)

ACTION_PREFIX = "approval:"
CHOICES = {"once": "Allow once", "always": "Always allow", "deny": "Deny"}


def request_text(req: ApprovalRequest, now: float) -> str:
    """What an approver reads (plain text)."""
    lines = [f"Approval needed ({req.id}): agent {req.agent_id} wants to run",
             f"  {req.command[:1500]}",
             f"Session: {req.session_key}",
             f"Why it asks: {req.reason}"]
    if req.binary:
        lines.append(f"Binary: {req.binary}")
    lines.append(f"Expires in {format_elapsed(max(0.0, req.expires_at - now))} "
                 "(no answer = deny).")
    return "\n".join(lines)


def buttons(req: ApprovalRequest) -> list[Button]:
    """Allow once / always allow (only for a plain command: its exact argv is stored) /
    deny; the action data is ``approval:<id>:<choice>``."""
    choices = ["once", "always", "deny"] if req.argv is not None else ["once", "deny"]
    return [Button(CHOICES[c], f"{ACTION_PREFIX}{req.id}:{c}",
                   "danger" if c == "deny" else "primary" if c == "once" else None)
            for c in choices]


def parse_action(action: str) -> tuple[str, str] | None:
    """``(request id, choice)`` of a button's action data, or None when it is not ours."""
    if not action.startswith(ACTION_PREFIX):
        return None
    rid, _, choice = action[len(ACTION_PREFIX):].partition(":")
    return (rid, choice) if rid and choice in CHOICES else None


def outcome_text(req: ApprovalRequest) -> str:
    """The line that replaces the buttons once a request is decided."""
    what = {"allowed": "Always allowed" if req.always else "Allowed once",
            "denied": "Denied", "expired": "Expired"}.get(req.status, req.status)
    by = f" by {req.decided_by}" if req.decided_by else ""
    return f"Approval {req.id}: {req.command[:300]}\n{what}{by}."


async def send_prompts(gw: Any, req: ApprovalRequest, now: float) -> None:
    """One message to every approver of ``req`` (buttons where the adapter can); what
    was sent is added to ``req.prompts``. A failed send is logged, never raised."""
    text = request_text(req, now)
    for approver in req.approvers:
        channel, _, to = approver.partition(":")
        adapter = gw.deliverer.find(channel)
        try:
            if adapter is not None and hasattr(adapter, "send_buttons"):
                mid = await adapter.send_buttons(to, text, buttons(req))
            else:
                result = await gw.deliverer.send(
                    Route(channel=channel, to=to), text + "\nAnswer with: tidegate approvals "
                    f"allow {req.id} [--always] | deny {req.id}", kind="notice")
                if not result.ok:
                    raise RuntimeError(result.error or "delivery failed")
                mid = result.message_ids[0] if result.message_ids else ""
        except Exception as exc:  # noqa: BLE001 - the other approvers still get theirs
            log.warning("approval_prompt_failed", approval_id=req.id, approver=approver,
                        error=str(exc)[:300])
            continue
        native = adapter is not None and hasattr(adapter, "send_buttons")
        req.prompts.append({"channel": channel, "to": to, "message_id": str(mid),
                            "kind": "buttons" if native else "text"})


async def close_prompts(gw: Any, req: ApprovalRequest) -> None:
    """Replace the buttons of every prompt of a decided ``req`` with the outcome."""
    text = outcome_text(req)
    for p in req.prompts:
        adapter = gw.deliverer.find(p["channel"])
        if p.get("kind") != "buttons" or adapter is None or not p.get("message_id"):
            continue
        try:
            await adapter.close_buttons(p["to"], p["message_id"], text)
        except Exception as exc:  # noqa: BLE001 - the decision stands
            log.warning("approval_prompt_update_failed", approval_id=req.id,
                        channel=p["channel"], error=str(exc)[:300])
