"""Routing: which agent handles a message, and the session key of its conversation.

Session keys (DESIGN.md "Session keys"; seed 003 §2.1) are built here and nowhere else:

- DM: ``agent:<agent>:main`` (dm_scope ``main``), ``agent:<agent>:dm:<peer>``
  (``per-peer``), ``agent:<agent>:<channel>:dm:<peer>`` (``per-channel-peer``, default),
  ``agent:<agent>:<channel>:<account>:dm:<peer>`` (``per-account-channel-peer``)
  (a thread inside a DM stays in the DM session; replies still go to the thread)
- group/channel: ``agent:<agent>:<channel>:group:<group_id>``; thread:
  ``agent:<agent>:<channel>:group:<group_id>:thread:<thread_id>``
- cron isolated runs ``agent:<agent>:cron:<job_id>`` (a fresh session id per run); subagents
  ``agent:<agent>:subagent:<uuid>``

Every id is normalised by :func:`normalize_id` (trimmed, lower-cased, ``%`` and ``:``
percent-escaped), so the same conversation always gets the same key whatever case or form
the platform sends, and an id containing ``:`` can never collide with another key's
structure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

DmScope = Literal["main", "per-peer", "per-channel-peer", "per-account-channel-peer"]


def normalize_id(value: object) -> str:
    """Canonical form of one key segment. Raises ValueError for an empty id."""
    text = str(value).strip().lower()
    if not text:
        raise ValueError("session key segment must not be empty")
    return text.replace("%", "%25").replace(":", "%3a").replace(" ", "%20")


@dataclass(frozen=True, slots=True)
class Route:
    """Where replies for a session go: channel, account, chat id (``to``) and thread."""

    channel: str
    to: str
    account: str = "default"
    thread: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"channel": self.channel, "account": self.account, "to": self.to,
                "thread": self.thread}

    @classmethod
    def from_dict(cls, d: dict | None) -> Route | None:
        if not d or not d.get("channel") or not d.get("to"):
            return None
        return cls(channel=d["channel"], to=str(d["to"]), account=d.get("account") or "default",
                   thread=d.get("thread"))

    @classmethod
    def parse_target(cls, target: str) -> Route:
        """Parse a delivery target ``<channel>:<to>[:<thread>]`` (e.g. ``telegram:42``).

        Raises ValueError when the target has no ``:``.
        """
        parts = target.split(":", 2)
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise ValueError(f"delivery target must look like <channel>:<to>, got {target!r}")
        return cls(channel=parts[0], to=parts[1], thread=parts[2] if len(parts) > 2 else None)


def main_session_key(agent_id: str) -> str:
    return f"agent:{normalize_id(agent_id)}:main"


def cron_session_key(agent_id: str, job_id: str) -> str:
    return f"agent:{normalize_id(agent_id)}:cron:{normalize_id(job_id)}"


def subagent_session_key(agent_id: str, run_uuid: str) -> str:
    return f"agent:{normalize_id(agent_id)}:subagent:{normalize_id(run_uuid)}"


def session_key_for(
    *,
    agent_id: str,
    channel: str,
    chat_type: str,
    peer_id: str | None = None,
    group_id: str | None = None,
    thread_id: str | None = None,
    account_id: str = "default",
    dm_scope: DmScope = "per-channel-peer",
) -> str:
    """Compose the session key of one conversation (the only key builder).

    ``chat_type`` is ``dm``, ``group``, ``channel`` or ``thread``. Raises ValueError when a
    needed id is missing.
    """
    agent = normalize_id(agent_id)
    ch = normalize_id(channel)
    if chat_type == "dm":
        if dm_scope == "main":
            key = f"agent:{agent}:main"
        else:
            peer = normalize_id(peer_id or "")
            if dm_scope == "per-peer":
                key = f"agent:{agent}:dm:{peer}"
            elif dm_scope == "per-account-channel-peer":
                key = f"agent:{agent}:{ch}:{normalize_id(account_id)}:dm:{peer}"
            else:
                key = f"agent:{agent}:{ch}:dm:{peer}"
        return key  # a thread inside a DM stays in the person's DM session
    if chat_type in ("group", "channel", "thread"):
        key = f"agent:{agent}:{ch}:group:{normalize_id(group_id or '')}"
        if thread_id:
            key += f":thread:{normalize_id(thread_id)}"
        return key
    raise ValueError(f"unknown chat type {chat_type!r}")


def agent_of_key(session_key: str) -> str:
    """The agent id of a session key (``agent:<agent>:...``). Raises ValueError otherwise."""
    parts = session_key.split(":")
    if len(parts) < 3 or parts[0] != "agent":
        raise ValueError(f"not a session key: {session_key!r}")
    return parts[1]


class IdentityLinks:
    """Maps one person's ids on several platforms to one canonical peer id.

    Config: ``session.identity_links: {alice: ["telegram:123", "discord:456"]}``. Lookups are
    by ``(channel, peer_id)``, case-insensitive; a bare id (no channel) matches any channel.
    """

    def __init__(self, links: dict[str, Iterable[str]] | None = None) -> None:
        self._by_channel: dict[tuple[str, str], str] = {}
        self._any: dict[str, str] = {}
        for canonical, ids in (links or {}).items():
            for ident in ids:
                ident = str(ident).strip().lower()
                if ":" in ident:
                    ch, pid = ident.split(":", 1)
                    self._by_channel[(ch, pid)] = canonical
                else:
                    self._any[ident] = canonical

    def canonical(self, channel: str, peer_id: str) -> str:
        pid = str(peer_id).strip().lower()
        return self._by_channel.get((channel.lower(), pid)) or self._any.get(pid) or peer_id


@dataclass(frozen=True, slots=True)
class BindingRule:
    """``bindings[]`` entry: agent plus optional match fields (None = any)."""

    agent: str
    channel: str | None = None
    account: str | None = None
    peer: str | None = None
    group: str | None = None
    chat_type: str | None = None

    def score(self, channel: str, account: str, peer: str, group: str | None,
              chat_type: str) -> int:
        """Specificity of a match (higher wins), or -1 when the rule does not match."""
        checks = ((self.channel, channel, 1), (self.account, account, 2),
                  (self.chat_type, chat_type, 1), (self.peer, peer, 4), (self.group, group, 4))
        total = 0
        for want, got, weight in checks:
            if want is None:
                continue
            if got is None or str(want).lower() != str(got).lower():
                return -1
            total += weight
        return total


def pick_agent(rules: list[BindingRule], default_agent: str, *, channel: str, account: str,
               peer: str, group: str | None, chat_type: str) -> str:
    """The agent for a message: the most specific matching binding (peer/group beats
    account beats channel; ties go to the first listed), else ``default_agent``."""
    best, best_score = default_agent, -1
    for rule in rules:
        s = rule.score(channel, account, peer, group, chat_type)
        if s > best_score:
            best, best_score = rule.agent.lower(), s
    return best
