"""Who wrote a message, in the user role (docs/group-chats.md): in a shared chat every
user message the model sees starts with its sender; the system role never holds it."""

from __future__ import annotations

from gateway.turns.work import UserWork

SHARED = ("group", "channel", "thread")


def attributed(w: UserWork) -> str:
    """The message text as the model sees it: in a shared chat (group, channel, thread)
    it starts with who wrote it, ``[from "<display name>" (<channel>:<sender id>)]``, in
    the user role (the name is the sender's own choice: quoted, one line, capped; it never
    goes to the system role). A DM's text is unchanged."""
    if w.chat_type not in SHARED or not (w.sender_name or w.sender_id):
        return w.text
    from runtime.neutralize import quote_untrusted
    name = quote_untrusted(w.sender_name or w.sender_id, 64)
    who = f"{w.channel}:{w.sender_id}" if w.sender_id else w.channel
    return f"[from {name} ({one_id(who)})]\n{w.text}"


def one_id(value: str) -> str:
    """An id for the attribution line: no whitespace or brackets, at most 80 chars."""
    return "".join(c for c in value if not c.isspace() and c not in "()[]")[:80]
