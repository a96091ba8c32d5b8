"""The email channel: one mailbox, IMAP IDLE in, SMTP out.

Lifecycle: ``start`` runs a supervised IMAP connection in the background (log in, SELECT
the folder, hand every mail above the checkpoint to the gateway in UID order, then IDLE
until the server announces new mail). A dropped connection, a refused connect or a
timeout reconnects after a backoff (doubling from ``backoff_initial`` to
``backoff_max`` seconds with 50-100 % jitter, on the injectable clock; state
``reconnecting``); a refused login fails the channel (``failed``: retrying a wrong
password would only lock the account). ``send`` submits one mail per reply over SMTP.

Every mail is a direct message from its sender's address (``chat_type`` ``dm``,
``peer_id`` = ``sender_id`` = the lower-cased address), so the access policy is the
chat platforms' (``dm_policy``, ``allow_from``, pairing); its ``thread_id`` is the root
Message-ID of its thread, and with ``thread_sessions`` (the default) each thread is its
own session (``agent:<agent>:email:dm:<address>:thread:<root>``). Automatic mail
(auto-replies, bounces, lists) is marked ``is_bot`` and never starts a turn.

Exactly once: the UID checkpoint (checkpoint.py) moves past a mail only after the gateway
journaled it; the inbound dedupe (keyed by Message-ID) covers a rescan after UIDVALIDITY
changed. No streaming: a mail cannot be edited once sent, so each reply is sent whole when
the turn ends. No typing indicator either.
"""

from __future__ import annotations

import asyncio
import random
import time
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from channels.base import (
    ChannelState,
    DeliveryResult,
    EventHandler,
    InboundHandler,
    InboundMessage,
    OutboundMessage,
)
from channels.email.checkpoint import Checkpoint
from channels.email.compose import compose, message_id_for, reply_subject, thread_headers
from channels.email.config import EmailAccount
from channels.email.imap import LoginRejected, Mailbox, open_mailbox
from channels.email.parse import ParsedMail, parse_mail
from channels.email.smtp import submit
from channels.reconnects import ConnectionCount
from channels.tasks import cancel_and_wait
from runtime.clock import SYSTEM_CLOCK, Clock, maybe_timeout, utc_iso

log = structlog.get_logger(__name__)

STOP_WAIT = 10.0  # seconds stop() waits for the mail being handed on
# the gateway's outcomes of a mail it took (channels/inbound): only their subjects and
# Message-IDs are kept; a refused sender's (denied, pairing, a duplicate of one) are not
ACCEPTED = frozenset({"queued", "held", "kept", "album", "command", "refused_media"})


class EmailChannel:
    """One mailbox (see the module docstring). ``checkpoint``: the document store of the
    UID checkpoint (``runtime.storage.documents.DocumentRecords``: the state file, or the
    PostgreSQL row; None = memory only). Raises ValueError when the account lacks its
    address, IMAP host or password."""

    name = "email"

    def __init__(self, account_id: str, config: EmailAccount, *, clock: Clock = SYSTEM_CLOCK,
                 media: Any = None, checkpoint: Any = None, backoff_initial: float = 1.0,
                 backoff_max: float = 60.0, start_timeout: float = 30.0) -> None:
        for key in ("address", "imap_host", "imap_password"):
            if not getattr(config, key):
                raise ValueError(f"channels.email.accounts.{account_id}.{key}: required")
        self.account_id = account_id
        self.state: ChannelState = "stopped" if config.enabled else "disabled"
        self._config = config
        self.address = str(config.address).strip().lower()
        self._login = config.imap_username or self.address
        self._secrets = [s for s in (config.imap_password, config.smtp_password) if s]
        self._clock = clock
        self._backoff = (backoff_initial, backoff_max)
        self._start_timeout = start_timeout
        self._rng = random.Random()
        self.checkpoint = Checkpoint.open(checkpoint)
        self._on_message: InboundHandler | None = None
        self._task: asyncio.Task | None = None
        self._box: Mailbox | None = None
        self._settled = asyncio.Event()
        self._stopping = False
        self._attempt = 0
        self._last_error: str | None = None
        self._connected_since: float | None = None
        self._connects = ConnectionCount()
        self._send_lock = asyncio.Lock()
        self._in_flight: asyncio.Future | None = None  # the mail being handed on

    # ------------------------------------------------------------------ lifecycle

    async def start(self, on_message: InboundHandler, on_event: EventHandler) -> None:
        """Start the supervised IMAP connection; returns once connected, retrying in the
        background, or failed (never raises for network trouble or a bad password)."""
        if self._task is not None and not self._task.done():
            return
        if not self._config.enabled:
            self.state = "disabled"
            return
        self._on_message, self._stopping = on_message, False
        self._settled = asyncio.Event()
        self._set_state("starting")
        self._task = asyncio.create_task(self._supervise(), name=f"email:{self.account_id}")
        with suppress(TimeoutError):
            async with maybe_timeout(self._clock, self._start_timeout):
                await self._settled.wait()

    async def stop(self) -> None:
        """Close the IMAP connection; idempotent. A mail being handed on finishes first
        (its checkpoint is saved)."""
        self._stopping = True
        task, self._task = self._task, None
        in_flight = self._in_flight
        if in_flight is not None and not in_flight.done():
            await asyncio.wait({in_flight}, timeout=STOP_WAIT)
        await cancel_and_wait(task)
        if self.state != "disabled":
            self._set_state("stopped")

    def status(self) -> dict[str, Any]:
        """``{"state", "account_id", "bot_id" (the address), "mailbox", "uidvalidity",
        "uid" (checkpoint), "last_error", "connected_since" (RFC 3339 UTC or None),
        "reconnects"}``."""
        return {"state": self.state, "account_id": self.account_id, "bot_id": self.address,
                "mailbox": self._config.mailbox, "uidvalidity": self.checkpoint.uidvalidity,
                "uid": self.checkpoint.uid, "last_error": self._last_error,
                "connected_since": utc_iso(self._connected_since)
                if self._connected_since is not None else None,
                "reconnects": self._connects.reconnects}

    async def typing(self, to: str, thread_id: str | None = None) -> None:
        """Mail has no typing indicator: nothing to do."""

    def _set_state(self, state: ChannelState) -> None:
        if state != self.state:
            log.info("email_state", account_id=self.account_id, state=state,
                     previous=self.state)
        self.state = state
        if state in ("connected", "reconnecting", "failed"):
            self._settled.set()

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    # ------------------------------------------------------------------ receiving

    async def _supervise(self) -> None:
        """Connect, catch up, IDLE; back off (clock) and reconnect on any failure."""
        while not self._stopping:
            error: str | None = None
            try:
                async with maybe_timeout(self._clock, float(self._config.connect_timeout)):
                    box = await open_mailbox(self._config, username=self._login,
                                             password=str(self._config.imap_password))
                self._box = box
                try:
                    await self._receive(box)
                finally:
                    self._box = None
                    await box.close()
            except asyncio.CancelledError:
                raise
            except LoginRejected as exc:
                self._last_error = f"IMAP login refused: {self._redact(str(exc))}"
                log.error("email_channel_failed", account_id=self.account_id,
                          reason=self._last_error)
                self._set_state("failed")
                return
            except Exception as exc:  # noqa: BLE001 - any failure means: back off, retry
                error = self._redact(f"{type(exc).__name__}: {exc}".strip().rstrip(":"))
            if self._stopping:
                return
            self._last_error = error
            delay = min(self._backoff[1], self._backoff[0] * 2 ** min(self._attempt, 16))
            delay *= 0.5 + self._rng.random() / 2
            self._attempt += 1
            self._set_state("reconnecting")
            log.warning("email_reconnect_scheduled", account_id=self.account_id,
                        error=error, attempt=self._attempt, delay_s=round(delay, 3))
            await self._clock.sleep(delay)

    async def _receive(self, box: Mailbox) -> None:
        await self._align(box)
        self._attempt, self._connected_since = 0, self._clock.time()
        self._connects.connected()
        log.info("email_connected", account_id=self.account_id, mailbox=box.name,
                 uidvalidity=box.uidvalidity, checkpoint_uid=self.checkpoint.uid,
                 idle=box.idle)
        self._set_state("connected")
        while not self._stopping:
            await self._drain(box)
            await box.wait_for_news(float(self._config.idle_timeout),
                                    float(self._config.poll_interval))

    async def _align(self, box: Mailbox) -> None:
        """Bring the checkpoint to this mailbox generation: at the first start, begin
        with the mail that arrives from now on; after a UIDVALIDITY change, rescan the
        mail since the last checkpoint's day (the dedupe drops what was handled)."""
        cp = self.checkpoint
        if cp.uidvalidity == box.uidvalidity:
            return
        if cp.uidvalidity is None:
            top = box.uidnext - 1 if box.uidnext else max(await box.uids_after(0), default=0)
            cp.reset(box.uidvalidity, top)
            log.info("email_checkpoint_started", account_id=self.account_id, uid=top,
                     effect="mail already in the folder is not answered")
        else:
            day = datetime.fromtimestamp(cp.saved_at or self._clock.time(), UTC)
            since = await box.uids_since(day.strftime("%d-%b-%Y"))
            start = (min(since) - 1) if since else max(box.uidnext - 1, 0)
            log.warning("email_uidvalidity_changed", account_id=self.account_id,
                        previous=cp.uidvalidity, uidvalidity=box.uidvalidity,
                        rescan_from_uid=start + 1, since=day.strftime("%Y-%m-%d"))
            cp.reset(box.uidvalidity, start)
        cp.save()

    async def _drain(self, box: Mailbox) -> None:
        """Hand every mail above the checkpoint to the gateway, in UID order. Each mail
        runs in its own task that ``stop`` lets finish (shielded), so a mail the gateway
        journaled always moves the checkpoint."""
        for uid in await box.uids_after(self.checkpoint.uid):
            if self._stopping:
                return
            self._in_flight = asyncio.ensure_future(self._handle(box, uid))
            if await asyncio.shield(self._in_flight) == "rejected":
                return  # the gateway is stopping: the next start takes it

    async def _handle(self, box: Mailbox, uid: int) -> str | None:
        raw = await box.fetch(uid)
        outcome = await self._deliver(box, uid, raw) if raw is not None else "gone"
        if outcome == "rejected":
            return outcome
        self.checkpoint.advance(uid, self._clock.time())
        if raw is not None and self._config.mark_seen:
            await box.mark_seen(uid)  # cosmetic: after the checkpoint
        return outcome

    async def _deliver(self, box: Mailbox, uid: int, raw: bytes) -> str | None:
        try:
            mail = parse_mail(raw)
        except (ValueError, LookupError, TypeError) as exc:
            log.warning("email_unparseable", account_id=self.account_id, uid=uid,
                        error=str(exc)[:200])
            return "unparseable"
        if mail.sender == self.address:
            return "own"
        msg = self._inbound(box, uid, mail)
        assert self._on_message is not None
        outcome = None
        try:
            outcome = await self._on_message(msg)
        finally:  # a refused sender's subject and ids are not kept (only the UID is)
            self.checkpoint.settle(keep=outcome in ACCEPTED)
        return outcome

    def _inbound(self, box: Mailbox, uid: int, mail: ParsedMail) -> InboundMessage:
        cp = self.checkpoint
        message_id = mail.message_id or f"<uid-{box.uidvalidity}-{uid}@{self.account_id}>"
        root = cp.thread_of(message_id, mail.refs)
        cp.hold(root)
        cp.remember(root, message_id, mail.subject, mail.refs)
        text = mail.text
        if root == message_id and mail.subject:  # a new thread: its subject is context
            text = f"Subject: {mail.subject}\n\n{text}" if text else f"Subject: {mail.subject}"
        return InboundMessage(channel="email", account_id=self.account_id, text=text,
                              sender_id=mail.sender, sender_name=mail.sender_name,
                              chat_type="dm", thread_id=root, message_id=message_id,
                              reply_to=mail.refs[-1] if mail.refs else None,
                              received_at=self._clock.time(), is_bot=mail.auto,
                              media=mail.media)

    # ------------------------------------------------------------------ sending

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        """One mail to ``message.to`` (an address): threaded under ``message.thread_id``
        (the thread's root Message-ID) and answering ``message.reply_to`` (else the mail
        a notice ``answers``: a pairing code goes into the stranger's thread), with
        ``message.media`` attached. See smtp.py for the outcome of failures."""
        to = message.to.strip()
        if "@" not in to or any(c in to for c in "\r\n,;<>"):
            return DeliveryResult(ok=False, error=f"invalid email address {to!r}")
        problem = self._files_problem(message.media)
        if problem:
            return DeliveryResult(ok=False, error=problem)
        cp = self.checkpoint
        # a notice (the pairing code, a command's answer) answers the mail it names
        answering = message.reply_to or message.answers
        root = message.thread_id or (cp.ids.get(answering) if answering else None)
        thread = cp.thread(root)
        in_reply_to, refs = thread_headers(thread, answering)
        subject = reply_subject(thread.get("subject"), self._config.subject) if thread \
            else self._config.subject
        mid = message_id_for(message.idempotency_key, self.address)
        try:
            mail = compose(sender=self.address, display_name=self._config.display_name,
                           to=to, text=message.text, subject=subject,
                           in_reply_to=in_reply_to, references=refs, message_id=mid,
                           files=message.media, now=self._clock.time() or time.time())
        except OSError as exc:
            return DeliveryResult(ok=False, error=f"attachment unreadable: {exc}")
        cfg = self._config
        async with self._send_lock:
            result = await submit(cfg, mail, username=cfg.smtp_username or self._login,
                                  password=cfg.smtp_password or cfg.imap_password)
        if result.error:
            result.error = self._redact(result.error)
        if result.ok and root:
            cp.remember(root, mid)
            await asyncio.to_thread(cp.save)
        log.info("email_sent" if result.ok else "email_send_failed",
                 account_id=self.account_id, message_id=mid, in_reply_to=in_reply_to,
                 files=len(message.media), error=result.error, retryable=result.retryable)
        return result

    def _files_problem(self, files: list[str]) -> str | None:
        total = 0
        for f in files:
            path = Path(f)
            if not path.is_file():
                return f"{path.name}: not a file"
            total += path.stat().st_size
        limit = self._config.max_attachment_bytes
        if total > limit:
            return (f"attachments are {total} bytes; channels.email.max_attachment_bytes "
                    f"allows {limit}")
        return None
