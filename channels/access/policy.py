"""Access policy: decide, before any model call, what happens to an inbound message.

DESIGN.md "The path of one message", step 2: DM policy (open | allowlist | pairing |
disabled), ``allow_from``, group policy and ``require_mention``. Denied messages are logged by
the gateway (with ``AccessDecision.reason``), never run.

Actions: ``run`` (start a turn), ``ignore`` (drop, log the reason), ``pair`` (reply with a
pairing code, channels/access/pairing.py), ``context`` (a group message that did not mention the
bot: the gateway may keep it as context but does not run a turn).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from channels.base import InboundMessage
from channels.config import AccessConfig

Action = Literal["run", "ignore", "pair", "context"]
IsPaired = Callable[[str, str, str], bool]


@dataclass(frozen=True, slots=True)
class AccessDecision:
    """``allowed`` is True only for ``action == "run"``; ``reason`` is a short machine string
    such as ``dm_open``, ``paired``, ``not_in_allowlist``, ``mention_required``."""

    allowed: bool
    reason: str
    action: Action


def _run(reason: str) -> AccessDecision:
    return AccessDecision(True, reason, "run")


def _ignore(reason: str) -> AccessDecision:
    return AccessDecision(False, reason, "ignore")


def _norm(value: str) -> str:
    return value.strip().lstrip("@").lower()


def sender_matches(msg: InboundMessage, allow_from: Iterable[str]) -> bool:
    """True when the sender's id or username is in ``allow_from``.

    Entries match case-insensitively, with or without a leading ``@``; ``"*"`` matches
    everyone; an entry may carry the channel as a prefix (``telegram:12345``), which must
    then equal ``msg.channel``. For a sender id that is an email address, an entry
    ``@example.org`` matches every address of that domain (not its subdomains).
    """
    ids = {_norm(msg.sender_id)}
    domain = msg.sender_id.rpartition("@")[2].lower() if "@" in msg.sender_id else None
    if msg.sender_username:
        ids.add(_norm(msg.sender_username))
    channel = msg.channel.lower()
    for entry in allow_from:
        e = entry.strip()
        if e == "*":
            return True
        prefix, sep, rest = e.partition(":")
        if sep and prefix.lower() == channel:
            e = rest
        if _norm(e) in ids or (domain and e.startswith("@") and e[1:].lower() == domain):
            return True
    return False


def _group_listed(group_id: str | None, groups: Iterable[str]) -> bool:
    if group_id is None:
        return False
    gid = group_id.strip().lower()
    return any(g.strip() == "*" or g.strip().lower() == gid for g in groups)


def group_settings(cfg: AccessConfig, group_id: str | None) -> Any:
    """``groups.<group_id>`` (else ``groups."*"``) when ``groups`` is a mapping, else None."""
    groups = getattr(cfg, "groups", None)
    if not isinstance(groups, dict) or not group_id:
        return None
    gid = group_id.strip().lower()
    for key, value in groups.items():
        if key.strip().lower() == gid:
            return value
    return groups.get("*")


def group_dm_scope(msg: InboundMessage, cfg: AccessConfig | None) -> str | None:
    """``groups.<id>.dm_scope`` for a group message with a sender, else None (the group's
    shared session)."""
    if cfg is None or msg.chat_type == "dm" or not msg.sender_id:
        return None
    return getattr(group_settings(cfg, msg.group_id), "dm_scope", None)


def mention_required(msg: InboundMessage, cfg: AccessConfig,
                     activation: str | None = None) -> bool:
    """Whether a group message needs the bot mentioned: ``/activation`` (``always`` |
    ``mention``, channels/access/activation.py) first, then ``groups.<id>.require_mention``, then
    the account's ``require_mention``."""
    if activation in ("always", "mention"):
        return activation == "mention"
    override = getattr(group_settings(cfg, msg.group_id), "require_mention", None)
    if override is not None:
        return bool(override)
    return bool(getattr(cfg, "require_mention", True))


def check_access(msg: InboundMessage, cfg: AccessConfig, *, is_paired: IsPaired | None = None,
                 bot_ids: set[str] | frozenset[str] = frozenset(),
                 activation: str | None = None) -> AccessDecision:
    """Decide what to do with ``msg`` under ``cfg``.

    ``is_paired(channel, account_id, sender_id)`` answers the pairing store (DM policy
    ``pairing``); without it nobody counts as paired. ``bot_ids`` are this bot's own user ids
    on the platform; ``activation``: the group's ``/activation`` mode, if set. Pure function: no I/O beyond ``is_paired``, no exceptions for valid input.
    Reasons: own_message, bot_sender, dm_disabled, dm_open, allowlisted, not_in_allowlist,
    paired, pairing_required, group_disabled, group_not_allowed, sender_not_allowed,
    mention_required, group_open, group_allowed.
    """
    if msg.sender_id in bot_ids:
        return _ignore("own_message")
    if msg.is_bot and not getattr(cfg, "allow_bots", False):
        return _ignore("bot_sender")
    allow_from = getattr(cfg, "allow_from", None) or []

    if msg.chat_type == "dm":
        policy = getattr(cfg, "dm_policy", "pairing")
        if policy == "disabled":
            return _ignore("dm_disabled")
        if policy == "open":
            return _run("dm_open")
        if sender_matches(msg, allow_from):
            return _run("allowlisted")
        if policy == "allowlist":
            return _ignore("not_in_allowlist")
        if is_paired is not None and is_paired(msg.channel, msg.account_id, msg.sender_id):
            return _run("paired")
        return AccessDecision(False, "pairing_required", "pair")

    policy = getattr(cfg, "group_policy", "allowlist")
    if policy == "disabled":
        return _ignore("group_disabled")
    if policy == "allowlist" and not _group_listed(msg.group_id, getattr(cfg, "groups", [])):
        return _ignore("group_not_allowed")
    if allow_from and not sender_matches(msg, allow_from):
        return _ignore("sender_not_allowed")
    if mention_required(msg, cfg, activation) and not msg.mentions_bot:
        return AccessDecision(False, "mention_required", "context")
    return _run("group_open" if policy == "open" else "group_allowed")
