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

Every id is normalised by :func:`normalize_id` (trimmed, ``%``, ``:`` and spaces
percent-escaped, lower-case), so an id containing ``:`` can never collide with another
key's structure. Case is folded only where the id space is case-insensitive by
construction (:data:`CASE_INSENSITIVE_CHANNELS`: Telegram and Discord ids are numbers,
Slack ids are upper-case ``U…``/``C…``), so the same conversation always gets the same key
whatever case the platform sends. Ids from every other source (the OpenAI-compatible
API's ``user``, webchat client ids, plugins) are case-sensitive: an upper-case letter is
percent-escaped (``CaseUser`` -> ``%43ase%55ser``) so two ids that differ only in case
never share a key, while the key itself stays lower-case. Identity links and bindings
compare ids by the same rule (:func:`canonical_id`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

DmScope = Literal["main", "per-peer", "per-channel-peer", "per-account-channel-peer"]


# Platforms whose ids never differ only in case (numbers, or Slack's upper-case ids;
# Telegram and Discord usernames are case-insensitive too).
CASE_INSENSITIVE_CHANNELS = frozenset({"telegram", "slack", "discord"})


def id_case_sensitive(channel: str | None) -> bool:
    """Whether ids from ``channel`` are case-sensitive (every source but the platforms in
    :data:`CASE_INSENSITIVE_CHANNELS`; None = a config name, folded)."""
    if channel is None:
        return False
    name = channel.strip().lower()
    if name in CASE_INSENSITIVE_CHANNELS:
        return False
    from channels import registry  # a plugin platform declares it (channels/sdk.py)
    plugin = registry.channel_plugin(name) if name not in ("webchat", "cli", "openai") \
        else None
    return not getattr(plugin, "case_insensitive_ids", False)


def canonical_id(channel: str | None, value: object) -> str:
    """The comparable form of an id from ``channel``: trimmed, and case-folded only when
    the channel's ids are case-insensitive (identity links, bindings)."""
    text = str(value).strip()
    return text if id_case_sensitive(channel) else text.lower()


def _escape_char(ch: str) -> str:
    if ch in "%: ":
        return f"%{ord(ch):02x}"
    if ch.lower() != ch:  # upper case: escape its UTF-8 bytes so the key stays lower-case
        return "".join(f"%{b:02x}" for b in ch.encode())
    return ch


def normalize_id(value: object, *, case_sensitive: bool = False) -> str:
    """Canonical form of one key segment: trimmed, ``%``/``:``/space percent-escaped,
    lower-case; with ``case_sensitive`` an upper-case letter is escaped instead of folded
    (so ``A`` and ``a`` stay distinct). Raises ValueError for an empty id."""
    text = str(value).strip()
    if not text:
        raise ValueError("session key segment must not be empty")
    if not case_sensitive:
        text = text.lower()
    return "".join(_escape_char(ch) for ch in text)


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
        """Parse a delivery target ``<channel>:<to>[:<thread>]`` (e.g. ``telegram:42``,
        ``matrix:@alice:example.org``: see :func:`split_chat`).

        Raises ValueError when the target has no ``:``.
        """
        channel, _, rest = target.partition(":")
        to, thread = split_chat(rest, channel)
        if not channel or not to:
            raise ValueError(f"delivery target must look like <channel>:<to>, got {target!r}")
        return cls(channel=channel, to=to, thread=thread)

    @classmethod
    def from_tool(cls, channel: str, to: str) -> Route:
        """The ``message`` tool's ``channel`` (``telegram`` or ``telegram:<account>``) and
        ``to`` (``<chat>[:<thread>]``). Raises ValueError for an empty part."""
        name, _, account = channel.strip().partition(":")
        chat, thread = split_chat(to.strip(), name)
        if not name or not chat or (":" in channel and not account.strip()):
            raise ValueError(f"channel must look like <channel> or <channel>:<account> and to "
                             f"like <chat>[:<thread>], got {channel!r} and {to!r}")
        return cls(channel=name, to=chat, account=account.strip() or "default",
                   thread=thread or None)


_SIGILS = ("@", "!", "#")  # Matrix user, room and alias ids: <sigil><local>:<server>


def split_chat(text: str, channel: str = "") -> tuple[str, str | None]:
    """``<chat>[:<thread>]`` -> (chat, thread or None). On ``matrix`` a chat id with a
    sigil (``@user:server``, ``!room:server``, ``#alias:server``, the server with an
    optional numeric port) keeps its own ``:server`` part."""
    parts = text.split(":")
    take = 1
    if channel.strip().lower() == "matrix" and parts[0][:1] in _SIGILS and len(parts) > 1:
        take = 3 if len(parts) > 2 and parts[2].isdigit() else 2
    chat, rest = ":".join(parts[:take]), ":".join(parts[take:])
    return chat, rest or None


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
    dm_threads: bool = False,
) -> str:
    """Compose the session key of one conversation (the only key builder).

    ``chat_type`` is ``dm``, ``group``, ``channel`` or ``thread``. A DM's ``thread_id``
    stays in the person's DM session unless ``dm_threads`` (the email channel's
    ``thread_sessions``: each mail thread its own session, ``<dm key>:thread:<id>``).
    Raises ValueError when a needed id is missing.
    """
    agent = normalize_id(agent_id)
    ch = normalize_id(channel)
    cs = id_case_sensitive(channel)
    if chat_type == "dm":
        if dm_scope == "main":
            key = f"agent:{agent}:main"
        else:
            peer = normalize_id(peer_id or "", case_sensitive=cs)
            if dm_scope == "per-peer":
                key = f"agent:{agent}:dm:{peer}"
            elif dm_scope == "per-account-channel-peer":
                key = f"agent:{agent}:{ch}:{normalize_id(account_id)}:dm:{peer}"
            else:
                key = f"agent:{agent}:{ch}:dm:{peer}"
        if dm_threads and thread_id:
            key += f":thread:{normalize_id(thread_id, case_sensitive=cs)}"
        return key  # else a thread inside a DM stays in the person's DM session
    if chat_type in ("group", "channel", "thread"):
        key = f"agent:{agent}:{ch}:group:{normalize_id(group_id or '', case_sensitive=cs)}"
        if thread_id:
            key += f":thread:{normalize_id(thread_id, case_sensitive=cs)}"
        return key
    raise ValueError(f"unknown chat type {chat_type!r}")


_STRUCTURE = frozenset({"agent", "main", "dm", "group", "thread", "cron", "subagent"})


def readable_key(session_key: str) -> str:
    """The key as a person writes it: upper-case letters that :func:`normalize_id`
    escaped are shown again (``...:dm:%43ase%55ser`` -> ``...:dm:CaseUser``); escapes of
    ``%``, ``:`` and spaces stay. :func:`canonical_key` of the result is the key again."""
    if "%" not in session_key:
        return session_key
    import re

    def decode(m: re.Match[str]) -> str:
        try:
            text = bytes.fromhex(m.group(0).replace("%", "")).decode("utf-8")
        except UnicodeDecodeError:
            return m.group(0)
        return "".join(c if c.lower() != c else _escape_char(c) for c in text)
    return re.sub(r"(?:%[0-9a-f]{2})+", decode, session_key)


def canonical_key(session_key: str) -> str:
    """A session key typed by a person or a client (CLI ``--session-key``, the API's
    ``X-Session-Key``, ``session_key`` bodies) in the form :func:`session_key_for` builds:
    structure words, agent, channel and account ids lower-cased; id segments from a
    case-sensitive source keep their case (upper-case letters percent-escaped, as
    :func:`normalize_id` does; escapes already present are kept), those from a
    case-insensitive platform are folded. So ``...:openai:dm:CaseUser`` names user
    ``CaseUser``'s session, never ``caseuser``'s."""
    parts = session_key.strip().split(":")
    if len(parts) < 3 or parts[0].lower() != "agent":
        return session_key.strip().lower()  # not a key: agent_of_key will say so
    rest = parts[2:]
    channel = None
    if rest[0].lower() not in _STRUCTURE:
        channel = rest[0].lower()
    # A per-peer key (no channel) may hold any source's id: keep its case (never merge).
    sensitive = id_case_sensitive(channel or "any")
    out = [p.lower() for p in parts[:2]]
    for i, seg in enumerate(rest):
        if sensitive and i and rest[i - 1].lower() in ("dm", "group", "thread"):
            out.append("".join(_escape_char(c) if c.lower() != c else c for c in seg))
        else:
            out.append(seg.lower())
    return ":".join(out)


def agent_of_key(session_key: str) -> str:
    """The agent id of a session key (``agent:<agent>:...``). Raises ValueError otherwise."""
    parts = session_key.split(":")
    if len(parts) < 3 or parts[0] != "agent":
        raise ValueError(f"not a session key: {session_key!r}")
    return parts[1]


class IdentityLinks:
    """Maps one person's ids on several platforms to one canonical peer id.

    Config: ``session.identity_links: {alice: ["telegram:123", "discord:456"]}``. Lookups are
    by ``(channel, peer_id)`` compared per :func:`canonical_id` (case matters for
    case-sensitive sources: ``openai:Ann`` does not match user ``ann``); a bare id (no
    channel) matches any channel by the same rule. The canonical name is a config name,
    returned lower-cased (config validation refuses two that differ only in case).
    """

    def __init__(self, links: dict[str, Iterable[str]] | None = None) -> None:
        self._by_channel: dict[tuple[str, str], str] = {}
        self._any_exact: dict[str, str] = {}  # bare ids, for case-sensitive sources
        self._any_folded: dict[str, str] = {}  # bare ids, for case-insensitive platforms
        for canonical, ids in (links or {}).items():
            name = str(canonical).strip().lower()
            for ident in ids:
                ch, sep, pid = str(ident).strip().partition(":")
                if sep:
                    ch = ch.strip().lower()
                    self._by_channel[(ch, canonical_id(ch, pid))] = name
                else:
                    self._any_exact[ch] = name
                    self._any_folded[ch.lower()] = name

    def canonical(self, channel: str, peer_id: str) -> str:
        ch = channel.strip().lower()
        pid = canonical_id(ch, peer_id)
        bare = self._any_exact if id_case_sensitive(ch) else self._any_folded
        return self._by_channel.get((ch, pid)) or bare.get(pid) or peer_id


def canonical_sender(links: IdentityLinks, channel: str, sender_id: str) -> str:
    """The canonical id of a sender: their identity-link name when ``links`` lists them,
    else ``<channel>:<id>`` (the id compared per :func:`canonical_id`)."""
    ch = channel.strip().lower()
    linked = links.canonical(ch, sender_id)
    if linked != sender_id:
        return linked
    return f"{ch}:{canonical_id(ch, sender_id)}"


def canonical_person(links: IdentityLinks, item: str) -> str:
    """The canonical id of a configured person (``agents.<id>.owners``, ``tools.taint.
    owners``, approvers): ``<channel>:<id>`` mapped through ``links`` (an id that belongs
    to a link counts as the link's name), or a bare identity-link name, lower-cased."""
    ch, sep, pid = str(item).strip().partition(":")
    if not sep:
        return ch.lower()
    return canonical_sender(links, ch, pid.strip())


def is_listed(links: IdentityLinks, people: Iterable[str], channel: str,
              sender_id: str | None) -> bool:
    """Whether the sender ``channel``/``sender_id`` is one of ``people`` (canonical ids as
    :func:`canonical_person` reads them; identity links apply, display names never)."""
    if not sender_id:
        return False
    mine = canonical_sender(links, channel, sender_id)
    return any(canonical_person(links, p) == mine for p in people)


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
        """Specificity of a match (higher wins), or -1 when the rule does not match.
        Config names (channel, account, chat type) match case-insensitively; peer and group
        ids per :func:`canonical_id` of the message's channel."""
        checks = ((self.channel, channel, 1, None), (self.account, account, 2, None),
                  (self.chat_type, chat_type, 1, None), (self.peer, peer, 4, channel),
                  (self.group, group, 4, channel))
        total = 0
        for want, got, weight, id_source in checks:
            if want is None:
                continue
            if got is None or canonical_id(id_source, want) != canonical_id(id_source, got):
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
