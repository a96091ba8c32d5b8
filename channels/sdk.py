"""The channel plugin contract, version :data:`SDK_VERSION` (major.minor).

A chat platform is a Python package that declares one entry point in the group
``tidegate.channels``; its name is the config key ``channels.<name>`` and its object is a
:class:`ChannelPlugin`. tidegate's own platforms (Telegram, Slack, Discord, WhatsApp,
Matrix, email) are registered the same way (``channels/telegram/plugin.py``), from
tidegate's ``pyproject.toml``::

    [project.entry-points."tidegate.channels"]
    echoroom = "echoroom.plugin:PLUGIN"

Within one major version this module only grows (new optional fields and methods); a
plugin declaring another major version is refused at start with an error naming it.

What a plugin provides:

- ``config``: a pydantic model of ``channels.<name>``, extending :class:`AccountConfig`
  (the access policy, streaming and reply settings every chat platform has) and usually
  :class:`PlatformSection` (``enabled``, ``accounts.<id>`` inheriting the section's keys,
  required keys checked only when enabled). Errors are reported as
  ``channels.<name>.<key>: <message>`` like the rest of the config.
- ``create(account_id, config, context)``: one adapter per enabled account; ``context`` is
  a :class:`ChannelContext` (clock, media settings, state files, storage).
- The adapter (subclass :class:`ChannelAdapter` or implement ``channels.base.Channel``):
  lifecycle ``start(on_message, on_event)`` / ``stop()`` / ``state`` / ``status()``;
  outbound ``send`` (and optionally ``edit``, ``react``, ``upload``, ``typing``);
  :class:`Capabilities` says which of them exist.
- Optional, for ``tidegate setup`` and the live checks (``channels status --probe``,
  ``doctor``): ``setup``, the questions the wizard asks (:class:`SetupField`, one per
  key of ``channels.<name>``); ``probe(account_config, timeout)``, an async function
  that checks one account's credentials against the platform and returns
  ``(ok, detail)``. A plugin without them is set up by editing ``config.yaml`` and is
  reported as "no live check".

Delivery guarantees a plugin gets by following three rules:

1. **Intake journal.** Await ``on_message(msg)`` (:meth:`ChannelAdapter.deliver`) before
   acknowledging the message to the platform (HTTP 200, committing an offset or a cursor):
   when it returns the message is journaled durably and will be answered after a crash.
2. **Dedupe.** Give every ``InboundMessage`` the platform's stable ``message_id``: a
   redelivered message (same channel, account, chat and id) is answered once.
3. **Outbox.** ``send`` returns a ``DeliveryResult``: ``ok`` with the platform's message
   ids; ``retryable=True`` only when the message certainly did not arrive (connection
   refused, 5xx before any part was accepted, 429) — the gateway parks it in the on-disk
   outbox and sends it again after the backoff and as soon as ``state`` is
   ``connected`` again; ``unconfirmed=True`` when a part's fate is unknown (it is not
   sent again, never doubled). :func:`sent`, :func:`not_sent`, :func:`unconfirmed` and
   :func:`refused` build them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from channels.base import (
    Button,
    ButtonPress,
    ChannelEvent,
    ChannelState,
    DeliveryResult,
    EventHandler,
    InboundHandler,
    InboundMessage,
    OutboundMessage,
)
from channels.config import AccessConfig, IdStr, LiveChatConfig, PlatformSection
from channels.media.model import InboundMedia
from channels.tasks import cancel_and_wait
from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.config_types import ConfigModel, Duration
from runtime.plugins import SDK_VERSION

__all__ = [
    "SDK_VERSION", "AccountConfig", "Button", "ButtonPress", "Capabilities",
    "ChannelAdapter", "ChannelContext", "ChannelEvent", "ChannelPlugin", "ChannelState",
    "ConfigModel", "DeliveryResult", "Duration", "EventHandler", "IdStr", "InboundHandler",
    "InboundMedia", "InboundMessage", "OutboundMessage", "PlatformSection", "Probe",
    "SetupField", "cancel_and_wait", "not_sent", "refused", "sent", "unconfirmed",
]


class AccountConfig(AccessConfig, LiveChatConfig):
    """The keys every chat platform account has: the access policy (``dm_policy``,
    ``allow_from``, ``groups``, ``require_mention``, ...) and the reply settings
    (``streaming``, ``reply_to_mode``, ``group_history``, ``tool_progress``). A plugin's
    account model extends it with its own keys (each with a ``description``)."""


@dataclass(frozen=True)
class Capabilities:
    """What the platform can do, for the gateway and ``tidegate plugins list``.

    ``threads``: replies can stay in a thread (``OutboundMessage.thread_id``); ``edits``:
    ``edit`` works (streamed replies grow in place); ``drafts``: a native draft/stream API;
    ``reactions``: ``react`` works; ``files``: media in and out (``upload``); ``buttons``:
    ``send_buttons`` (approvals). ``markup``: how replies are rendered
    (``telegram`` | ``slack`` | ``discord`` | ``plain``); ``text_limit``: one message's
    limit in characters (long replies are split below it)."""

    threads: bool = False
    edits: bool = False
    drafts: bool = False
    reactions: bool = False
    files: bool = False
    buttons: bool = False
    markup: str = "plain"
    text_limit: int = 4000

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class ChannelContext:
    """What the gateway gives an adapter besides its config.

    ``clock``: the injectable clock (use ``clock.time()``/``clock.sleep()``, never
    ``time``/``asyncio.sleep``, so tests drive time); ``media``: the ``media`` settings
    (size limits, ``runtime/media/config.py``); ``state_dir``: ``<state_dir>/channels``,
    where :meth:`state_path` names this account's files; ``records(kind, **opts)``: the
    PostgreSQL backend of a named store for this account, or None on embedded storage
    (``gateway/service/storage.py``); ``problems``: append a line to show it in ``status``.
    """

    name: str
    account_id: str
    clock: Clock = SYSTEM_CLOCK
    media: Any = None
    state_dir: Path | None = None
    records: Callable[..., Any] = field(default=lambda kind, **opts: None, repr=False)
    problems: list[str] = field(default_factory=list, repr=False)
    documents: Callable[[str], Any] | None = field(default=None, repr=False)

    def state_path(self, suffix: str) -> Path:
        """``<state_dir>/channels/<name>-<account>-<suffix>`` (the directory exists).
        Raises RuntimeError without a state directory."""
        if self.state_dir is None:
            raise RuntimeError(f"channel {self.name}: no state directory")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        return self.state_dir / f"{self.name}-{self.account_id}-{suffix}"

    def document(self, suffix: str) -> Any:
        """A small whole-document store (``read() -> bytes | None``, ``write(bytes)``,
        ``keep_aside()``; ``runtime/storage/documents.py``) for this account's state — a
        sync token, a cursor — that works on both storages: the file
        :meth:`state_path` ``(suffix)`` on embedded storage, the shared
        ``state_documents`` row ``<name>/<account>/<suffix>`` on PostgreSQL (so a replica
        that takes the account over continues where the last one stopped)."""
        if self.documents is not None:
            made = self.documents(f"{self.name}/{self.account_id}/{suffix}")
            if made is not None:
                return made
        from runtime.storage.embedded.document_file import DocumentFile
        return DocumentFile(self.state_path(suffix))


@dataclass(frozen=True)
class SetupField:
    """One question ``tidegate setup`` asks for a channel: the answer becomes the key
    ``key`` of ``channels.<name>`` (a string; pydantic converts numbers).

    ``prompt``: the question; ``default``: the answer on Enter (``""`` = leave the key
    out, the model's default applies); ``choices``: the allowed answers; ``secret``: read
    hidden, kept in the 0600 env file as ``env`` (``<NAME>_<KEY>`` when empty) and
    written to the config as ``${env}``; ``optional``: an empty answer is allowed.
    Non-interactively each field is the flag ``--<name>-<key>`` (a secret:
    ``--<name>-<key>-env VAR``, naming the environment variable that holds it);
    ``advanced`` fields are never asked, only taken from their (hidden) flag;
    ``unless``: not asked when the field of that key got an answer (a password after an
    access token)."""

    key: str
    prompt: str
    default: str = ""
    choices: tuple[str, ...] = ()
    secret: bool = False
    env: str = ""
    optional: bool = False
    advanced: bool = False
    unless: str = ""

    def env_name(self, channel: str) -> str:
        """The environment variable a secret answer is stored under."""
        return self.env or f"{channel}_{self.key}".upper()


Probe = Callable[[Any, float], Awaitable[tuple[bool, str]]]
"""``async probe(account_config, timeout_s) -> (ok, detail)``: one live check of an
account's credentials (a login, an identity call), ``detail`` one line for the operator
(``bot @name``; ``login refused``). Must not raise for network trouble or a refused
login (return ``(False, why)``), never put a secret in ``detail``, and change nothing on
the platform."""


@dataclass(frozen=True)
class ChannelPlugin:
    """The object an entry point of ``tidegate.channels`` points to.

    ``name``: the entry point's name and the config key; ``config``: the section model;
    ``create(account_id, account_config, context) -> adapter`` (may raise ValueError with
    a message naming the key, e.g. ``channels.<name>.token: required``: that account is
    not started and the message is shown in ``status``); ``sdk_version``: the SDK this
    plugin was written for; ``description``: one line for the docs and ``plugins list``;
    ``case_insensitive_ids``: the platform's ids differ only in case for the same chat
    (session keys are lower-cased either way); ``setup``: the wizard's questions
    (:class:`SetupField`), in order; ``probe``: the live credential check (:data:`Probe`)
    of ``channels status --probe``, ``doctor`` and ``setup``. Both optional."""

    name: str
    config: type
    create: Callable[[str, Any, ChannelContext], Any]
    sdk_version: str = SDK_VERSION
    capabilities: Capabilities = Capabilities()
    description: str = ""
    case_insensitive_ids: bool = False
    setup: tuple[SetupField, ...] = ()
    probe: Probe | None = None


def sent(*message_ids: str) -> DeliveryResult:
    """Every part arrived; the platform's ids of the parts."""
    return DeliveryResult(ok=True, message_ids=[str(i) for i in message_ids])


def not_sent(error: str) -> DeliveryResult:
    """Certainly not delivered (nothing reached the platform): the outbox retries it."""
    return DeliveryResult(ok=False, error=error, retryable=True)


def unconfirmed(error: str, *message_ids: str) -> DeliveryResult:
    """A part's outcome is unknown (written, never answered): recorded, not resent."""
    return DeliveryResult(ok=False, error=error, unconfirmed=True,
                          message_ids=[str(i) for i in message_ids])


def refused(error: str) -> DeliveryResult:
    """The platform refused it for good (unknown chat, forbidden): not retried."""
    return DeliveryResult(ok=False, error=error)


class ChannelAdapter:
    """A base for plugin adapters: state keeping, the inbound hooks, rendering and
    default (absent) optional operations. Subclasses implement :meth:`open` (connect;
    return once the first attempt is over, keep receiving in background tasks),
    :meth:`close` and :meth:`send`; the optional ``edit``, ``react``, ``upload`` and
    ``typing`` match :class:`Capabilities`. ``capabilities`` is the plugin's
    (``ChannelPlugin.capabilities``, set by the gateway when it creates the adapter);
    a class attribute counts only when the plugin keeps the default.

    ``state`` is one of ``starting | connected | reconnecting | failed | disabled |
    stopped``; set it with :meth:`set_state` — the gateway follows it (``status``,
    ``/readyz``, and the outbox is flushed when it becomes ``connected``)."""

    name: str = ""
    capabilities: Capabilities = Capabilities()

    def __init__(self, account_id: str, config: Any, context: ChannelContext) -> None:
        self.account_id = account_id
        self.config = config
        self.context = context
        self.clock = context.clock
        self.state: ChannelState = "stopped"
        self.last_error: str | None = None
        self.connected_since: float | None = None
        self.on_press: Any = None  # ButtonPress handler, set by the gateway
        self._on_message: InboundHandler | None = None
        self._on_event: EventHandler | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self, on_message: InboundHandler, on_event: EventHandler) -> None:
        """Keep the gateway's handlers, then :meth:`open`. Network trouble must not raise
        (set ``failed``/``reconnecting`` and retry); a bad config may (ValueError)."""
        self._on_message, self._on_event = on_message, on_event
        self.set_state("starting")
        await self.open()

    async def stop(self) -> None:
        """:meth:`close`, then ``stopped``. Called once at shutdown; must not raise."""
        try:
            await self.close()
        finally:
            self.set_state("stopped")

    async def open(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        return None

    def set_state(self, state: ChannelState, error: str | None = None) -> None:
        """Change ``state`` (and ``last_error`` when given); ``connected`` stamps
        ``connected_since`` from the clock."""
        if state == "connected" and self.state != "connected":
            self.connected_since = self.clock.time()
        self.state = state
        if error is not None:
            self.last_error = error

    def health(self) -> dict[str, Any]:
        """``{state, last_error, connected_since}`` (epoch seconds or None)."""
        return {"state": self.state, "last_error": self.last_error,
                "connected_since": self.connected_since}

    def status(self) -> dict[str, Any]:
        """The status snapshot (``tidegate status``): :meth:`health` plus ``account_id``
        and the capability flags."""
        return {**self.health(), "account_id": self.account_id,
                "capabilities": self.capabilities.as_dict()}

    # -- inbound -------------------------------------------------------------------------
    async def deliver(self, message: InboundMessage) -> str | None:
        """Hand one inbound message to the gateway; returns its outcome (``queued``,
        ``duplicate``, ``denied``, ``command``, ...). When this returns the message is in
        the intake journal: acknowledge it to the platform only now. ``channel`` and
        ``account_id`` are filled in. Raises RuntimeError before :meth:`start`."""
        if self._on_message is None:
            raise RuntimeError(f"channel {self.name}: deliver() before start()")
        message.channel, message.account_id = self.name, self.account_id
        return await self._on_message(message)

    async def event(self, event: ChannelEvent) -> None:
        """Hand a reaction/edit/delete/pin to the gateway (a system event)."""
        if self._on_event is not None:
            event.channel, event.account_id = self.name, self.account_id
            await self._on_event(event)

    # -- outbound ------------------------------------------------------------------------
    def parts(self, text: str) -> list[str]:
        """``text`` (model Markdown) rendered for ``capabilities.markup`` and split below
        ``capabilities.text_limit``, code fences closed and reopened across parts."""
        from channels.outbound.render import render_chunks
        caps = self.capabilities
        return [c.formatted for c in render_chunks(text, caps.markup, limit=caps.text_limit)]

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        """Deliver ``message`` (use :meth:`parts`; upload ``message.media`` when
        ``files``). Must not raise for platform errors: return a result."""
        raise NotImplementedError

    async def edit(self, to: str, message_id: str, text: str,
                   thread_id: str | None = None) -> DeliveryResult:
        """Replace the text of an earlier message (``edits``)."""
        return refused(f"{self.name} cannot edit messages")

    async def react(self, to: str, thread_id: str | None, message_id: str, emoji: str, *,
                    remove: bool = False) -> None:
        """Add (or remove) a reaction (``reactions``); errors are logged, never fatal."""
        raise NotImplementedError(f"{self.name} has no reactions")

    async def upload(self, to: str, path: Path, *, thread_id: str | None = None,
                     caption: str | None = None) -> DeliveryResult:
        """Upload one file (``files``)."""
        return refused(f"{self.name} cannot upload files")

    async def typing(self, to: str, thread_id: str | None = None) -> None:
        """Show a typing indicator once (the gateway repeats it during a turn)."""
        return

    async def act(self, action: str, route: Any, args: dict[str, Any]) -> str:
        """A channel tool of the model (``react`` when ``capabilities.reactions``): runs
        :meth:`react` on ``args["message_id"]`` in the turn's chat. Returns what the model
        is told; raises RuntimeError for an action this channel does not have."""
        if action == "react" and self.capabilities.reactions:
            await self.react(route.to, route.thread, str(args["message_id"]),
                             str(args["emoji"]))
            return f"reacted {args['emoji']} to {args['message_id']}"
        raise RuntimeError(f"{self.name} has no {action}")
