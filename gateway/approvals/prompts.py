"""The messages an approval request sends: to every approver, with native buttons where
the adapter has them (channels/base.py ``ButtonChannel``: Telegram inline keyboard...),
else as plain text naming the CLI command; and their update once decided."""

from __future__ import annotations

import unicodedata
from typing import Any

import structlog

from channels.base import Button
from gateway.routing import Route
from runtime.approvals.store import ApprovalRequest
from runtime.clock import format_elapsed

log = structlog.get_logger(__name__)

ACTION_PREFIX = "approval:"
CHOICES = {"once": "Allow once", "always": "Always allow", "deny": "Deny"}
SHOWN_MAX = 1000
"""The longest command (escaped) a chat prompt shows whole; the prompt text stays under
the smallest platform limit (Discord: 2,000 characters) with the other lines capped too.
A longer command is shown as head and tail with a marker, and gets only "Deny"."""
_KEEP = 400  # characters of head and of tail shown of a longer command
_NAMED = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn"})
_DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160),
    (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF))
"""Unicode's ``Default_Ignorable_Code_Point`` (DerivedCoreProperties.txt): code points
a renderer shows as nothing when it does not support them (fillers, variation
selectors, the combining grapheme joiner, format controls...). ``unicodedata`` does not
expose the property; this is its whole table, the reserved ranges included."""
# symbols (category So) that draw nothing yet are neither ignorable nor fillers:
# BRAILLE PATTERN BLANK, MUSICAL SYMBOL NULL NOTEHEAD, IDEOGRAPHIC HALF FILL SPACE
_BLANK_LOOKING = frozenset([0x2800, 0x1D159, 0x303F])


def _escaped(ch: str) -> bool:
    """Whether ``ch`` is written as an escape: controls, format characters (bidi
    overrides and isolates, zero-width...), line/paragraph separators, unassigned and
    private code points, every space but U+0020 (NBSP, U+3000... look like a word
    break but are not one), default-ignorable code points (:data:`_DEFAULT_IGNORABLE`),
    fillers of any script (their name says FILLER: Hangul, Khitan U+16FE4...) and the
    symbols that draw nothing (:data:`_BLANK_LOOKING`: the blank Braille pattern, the
    musical null notehead U+1D159): a word made of them looks empty, or like no word at
    all, yet is an argument."""
    cat = unicodedata.category(ch)
    if cat in _ESCAPED_CATEGORIES or (cat == "Zs" and ch != " "):
        return True
    code = ord(ch)
    if code < 0xAD:
        return False  # ASCII and Latin-1 letters: the fast path
    return (code in _BLANK_LOOKING or any(lo <= code <= hi for lo, hi in _DEFAULT_IGNORABLE)
            or "FILLER" in unicodedata.name(ch, ""))


def hidden(text: str) -> bool:
    """Whether ``text`` holds a character :func:`visible` writes as an escape because it
    is invisible or blank-looking (a backslash is escaped too, but is visible)."""
    return any(ch in _NAMED or _escaped(ch) for ch in text)


def visible(text: str) -> str:
    """``text`` with every invisible or blank-looking character (:func:`_escaped`)
    written as an escape (``\\r``, ``\\u202e``, ``\\u3164``), so what an approver reads
    is what runs; a literal backslash is written ``\\\\``, so a typed ``\\u202e`` never
    looks like an escaped U+202E. The one implementation: the chat prompts, the CLI and
    the control UI's Approvals view (through the control API's ``shown`` fields) all use
    it."""
    out = []
    for ch in text:
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif ch == "\\":
            out.append("\\\\")
        elif _escaped(ch):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else
                       f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def shown_fields(request: dict[str, Any]) -> dict[str, Any]:
    """The ``shown`` object the control API adds to a request dict
    (``ApprovalRequest.to_dict()``): its ``command``, ``session_key``, ``reason`` and
    ``binary`` through :func:`visible` (None stays None), and ``escaped``: whether the
    command had anything to escape. The control UI displays these, never the raw ones."""
    out: dict[str, Any] = {k: None if request.get(k) is None else visible(str(request[k]))
                           for k in ("command", "session_key", "reason", "binary",
                                     "decided_by")}
    out["escaped"] = hidden(str(request.get("command") or ""))
    return out


def pattern_shown(pattern: dict[str, Any]) -> dict[str, Any]:
    """The ``shown`` object of a stored "always allow" pattern (``{pattern, by, at}``):
    its ``pattern`` and ``by`` through :func:`visible`, and ``escaped``."""
    text = str(pattern.get("pattern") or "")
    return {"pattern": visible(text), "by": visible(str(pattern.get("by") or "")),
            "escaped": hidden(text)}


def too_long(req: ApprovalRequest) -> bool:
    """Whether ``req``'s command cannot be shown whole in a chat prompt: it is then
    decided there only by "Deny"; allowing it takes ``tidegate approvals allow``, which
    shows it whole."""
    return len(visible(req.command)) > SHOWN_MAX


def shown_command(command: str, limit: int = SHOWN_MAX) -> list[str]:
    """The prompt lines showing ``command`` (escaped): whole when it fits in ``limit``
    characters, else a marked head and tail naming its length."""
    text = visible(command)
    if len(text) <= limit:
        return [f"  {text}"]
    keep = min(_KEEP, limit // 2)
    return [(f"  [TRUNCATED: the command is {len(command)} characters; only its first and "
             f"last {keep} are shown]"),
            f"  {text[:keep]}",
            f"  [... {len(text) - 2 * keep} characters not shown ...]",
            f"  {text[-keep:]}"]


def request_text(req: ApprovalRequest, now: float) -> str:
    """What an approver reads (plain text, at most ~1,850 characters)."""
    lines = [f"Approval needed ({req.id}): agent {req.agent_id} wants to run",
             *shown_command(req.command),
             *_runs_line(req),
             f"Session: {visible(req.session_key)[:120]}",
             f"Why it asks: {visible(req.reason)[:300]}"]
    if req.binary:
        lines.append(f"Binary: {visible(req.binary)[:150]}")
    if too_long(req):
        lines.append("Too long to show here: only Deny is offered. To allow it, read it "
                     f"whole and decide with `tidegate approvals list` and "
                     f"`tidegate approvals allow {req.id}`.")
    if hidden(req.command):
        lines.append("(Control or invisible characters in it are shown escaped.)")
    lines.append(f"Expires in {format_elapsed(max(0.0, req.expires_at - now))} "
                 "(no answer = deny).")
    return "\n".join(lines)


def _runs_line(req: ApprovalRequest) -> list[str]:
    """Where the command runs: an approver allows a command on the host knowingly."""
    if req.runs == "host":
        return ["Where: runs on the host (no sandbox)"]
    if req.runs == "sandbox":
        return ["Where: runs in the sandbox"]
    return []


def buttons(req: ApprovalRequest) -> list[Button]:
    """Allow once / always allow (:func:`always_offered`) / deny; the action data is
    ``approval:<id>:<choice>``. A command too long to show whole
    (:func:`too_long`) gets only Deny."""
    choices = ["once", "always", "deny"] if always_offered(req) else ["once", "deny"]
    if too_long(req):
        choices = ["deny"]
    return [Button(CHOICES[c], f"{ACTION_PREFIX}{req.id}:{c}",
                   "danger" if c == "deny" else "primary" if c == "once" else None)
            for c in choices]


def always_offered(req: ApprovalRequest) -> bool:
    """Whether "always allow" is offered: a plain command (its exact argv is stored)
    asked by a turn that is not tainted."""
    return req.argv is not None and not req.tainted


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
    return "\n".join([f"Approval {req.id}:", *shown_command(req.command, 300),
                      f"{what}{by}."])


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
                    f"allow {req.id}{' [--always]' if always_offered(req) else ''} | "
                    f"deny {req.id}", kind="notice")
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
