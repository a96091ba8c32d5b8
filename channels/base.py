"""The shared channel model: what adapters emit (InboundMessage), what they accept
(OutboundMessage), and the Channel protocol every adapter implements.

Adapters never call the agent loop: they turn platform events into ``InboundMessage`` and
hand them to the gateway through the ``emit`` callback given to ``start``; the gateway hands
replies back as ``OutboundMessage`` (DESIGN.md "The path of one message", steps 1 and 8).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from channels.media.model import InboundMedia

ChatType = Literal["dm", "group", "channel", "thread"]
ChannelState = Literal["starting", "connected", "reconnecting", "failed", "disabled", "stopped"]


@dataclass(slots=True)
class InboundMessage:
    """One normalised inbound chat message.

    Ids are the platform's own, as strings. ``received_at`` is epoch seconds.
    ``chat_type``: ``dm`` (peer_id = sender), ``group``/``channel`` (group_id set), ``thread``
    (group_id and thread_id set). ``mentions_bot`` is True when the bot was @-mentioned or the
    message replies to the bot. ``sender_username`` is used for ``allow_from`` matching. ``media`` lists attached files
    (channels/media/model.py); the gateway downloads them after the access policy.
    """

    channel: str
    text: str
    sender_id: str
    chat_type: ChatType = "dm"
    account_id: str = "default"
    peer_id: str = ""
    group_id: str | None = None
    thread_id: str | None = None
    sender_name: str | None = None
    sender_username: str | None = None
    mentions_bot: bool = False
    message_id: str | None = None
    reply_to: str | None = None
    received_at: float = 0.0
    is_bot: bool = False
    raw: Any = field(default=None, repr=False)
    media: list[InboundMedia] = field(default_factory=list)  # attachments, not yet fetched
    album_id: str | None = None  # Telegram media_group_id: parts merged into one turn

    def __post_init__(self) -> None:
        if not self.peer_id:
            self.peer_id = self.sender_id


@dataclass(slots=True)
class OutboundMessage:
    """A reply or notification for a channel.

    ``to`` is the platform chat/peer id to send to; ``thread_id`` keeps replies in a thread;
    ``reply_to`` quotes the triggering message where the platform supports it: on the
    first part only, or on every part when ``reply_to_all`` (``reply_to_mode: all``). ``text`` is
    model markdown; adapters convert it to their markup and split it to the platform limit.
    ``kind`` is ``reply`` (a turn's answer), ``notice`` (commands, pairing) or ``alert``.
    ``answers``: the ``message_id`` of the inbound message a notice answers (a command), so
    a native command invocation takes its own answer and never an unrelated notice.
    ``media`` are absolute paths of files to upload natively after the text (checked against
    the platform's size limit first: channels/media/outbound.py).
    """

    channel: str
    to: str
    text: str
    account_id: str = "default"
    thread_id: str | None = None
    reply_to: str | None = None
    kind: str = "reply"
    session_key: str | None = None
    run_id: str | None = None
    media: list[str] = field(default_factory=list)  # absolute file paths to upload
    idempotency_key: str | None = None  # stable across retries (Discord nonces)
    reply_to_all: bool = False
    answers: str | None = None  # inbound message_id this notice answers (commands)


@dataclass(slots=True)
class DeliveryResult:
    """What a send did: ``ok``; platform message ids of the parts sent; ``error`` text.
    ``retryable``: it certainly did not arrive and may be sent again; ``unconfirmed``: one
    part's outcome is unknown (written, never answered) and it is not sent again
    (channels/outbound/send_outcome.py)."""

    ok: bool
    message_ids: list[str] = field(default_factory=list)
    error: str | None = None
    retryable: bool = False
    unconfirmed: bool = False


@dataclass(slots=True)
class ChannelEvent:
    """A non-message platform event that becomes a ride-along system event for the
    conversation's session. ``kind`` is the same on every platform: ``reaction`` (added
    or removed), ``edit``, ``delete`` or ``pin``; the gateway uses ``<channel>.<kind>``
    (e.g. ``slack.reaction``) as the system event's source. ``text`` is a one-line,
    human-readable description for the model."""

    channel: str
    kind: str
    text: str
    account_id: str = "default"
    chat_type: ChatType = "dm"
    peer_id: str = ""
    group_id: str | None = None
    thread_id: str | None = None
    sender_id: str | None = None


@dataclass(slots=True)
class ButtonPress:
    """Someone pressed a button the bot sent (Telegram callback query, Slack Block Kit
    action, Discord component interaction). ``action`` is the button's data as sent
    (``approval:<id>:once``); ``sender_id`` the platform id of who pressed it; ``to`` /
    ``message_id`` the message carrying the buttons. ``answer(text)`` gives the presser a
    short reply only they see (Telegram: answerCallbackQuery; Slack: an ephemeral
    message; Discord: an ephemeral interaction response)."""

    channel: str
    action: str
    sender_id: str
    account_id: str = "default"
    sender_name: str | None = None
    to: str = ""
    message_id: str | None = None
    answer: Callable[[str], Awaitable[None]] | None = field(default=None, repr=False)


@dataclass(slots=True)
class Button:
    """One button to send: its ``label`` and the ``action`` data a press reports back
    (at most 64 bytes: Telegram's callback_data limit). ``style``: primary | danger |
    None (where the platform has styles)."""

    label: str
    action: str
    style: str | None = None


PressHandler = Callable[[ButtonPress], Awaitable[None]]


# Returns None, or the gateway's outcome for the message ("queued", "command", "denied",
# ...; gateway/inbound/intake.py) which adapters may use (native command answers).
InboundHandler = Callable[[InboundMessage], Awaitable[str | None]]
EventHandler = Callable[[ChannelEvent], Awaitable[None]]


class Channel(Protocol):
    """One running adapter instance (one account of one platform)."""

    name: str
    account_id: str
    state: ChannelState

    async def start(self, on_message: InboundHandler, on_event: EventHandler) -> None:
        """Connect and begin delivering inbound messages; return once started
        (connection keeps running in background tasks)."""

    async def stop(self) -> None:
        """Disconnect and release resources."""

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        """Deliver one outbound message (split/format as the platform needs)."""

    async def typing(self, to: str, thread_id: str | None = None) -> None:
        """Show a typing indicator once (the gateway refreshes it while a turn runs)."""

    def status(self) -> dict[str, Any]:
        """A JSON-able status snapshot: at least ``state``."""


class ButtonChannel(Protocol):
    """An adapter that can send buttons (optional; the approvals use it). ``on_press`` is
    set by the gateway before ``start`` and gets every :class:`ButtonPress`."""

    on_press: PressHandler | None

    async def send_buttons(self, to: str, text: str, buttons: list[Button]) -> str:
        """Send ``text`` (plain) with ``buttons`` into chat ``to``; returns the message id.
        Raises RuntimeError when the platform refused or the adapter is not running."""

    async def close_buttons(self, to: str, message_id: str, text: str) -> None:
        """Replace the buttons of an earlier message with ``text`` (the outcome)."""
