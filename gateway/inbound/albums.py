"""Albums: a Telegram media group (several updates sharing ``media_group_id``) becomes one
turn, without giving up crash safety (issue 12 "Media in"; README "Delivery guarantees").

Every part goes through intake like any message — access policy, download, and the
intake journal (durable before the adapter confirms the update) — and only then waits
here, ``media.album_wait`` seconds after the latest part (clock), before the parts are
merged into one :class:`UserWork` (texts joined in arrival order, every file kept; the
first part's ids and route). A kill -9 during the wait therefore loses nothing: at the
next start the journal resumes the parts and :func:`group_entries` merges them again, so
the album is answered once; parts that had not run wait again at the start, so a part
the platform delivers only after the restart joins them.

Mention-gated groups: a part that fails the access check only for lack of a mention (the
caption, with the @mention, is on one part) is held, not downloaded; when a part of the
same album passes, the held parts are accepted too. An album of which no part passed is
dropped as ``mention_required`` when its wait ends. A held part is journaled too (a
``gated`` entry: the message without its bytes, its files by their platform handle,
Telegram's ``file_id``), so a kill -9 while it waits for the mentioning part loses
nothing: at the next start :func:`restore_gated` holds it again (the mentioning part may
still come) or, when its album had already passed, it is accepted and merged at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from channels.base import InboundMessage
from channels.media import InboundMedia
from gateway.turns.work import UserWork
from runtime.clock import Clock

log = structlog.get_logger(__name__)


def album_key(msg: InboundMessage) -> str:
    """One album of one chat of one account."""
    return f"{msg.channel}:{msg.account_id}:{msg.group_id or msg.peer_id}:{msg.album_id}"


def merge_works(works: list[UserWork]) -> UserWork:
    """One UserWork for an album's parts (see the module docstring); the other parts'
    journal entries ride along in ``album_parts`` and are finished with it."""
    first = works[0]
    return dataclasses.replace(
        first, text="\n".join(w.text for w in works if w.text),
        media=[m for w in works for m in w.media],
        album_parts=[w.journal_id for w in works[1:] if w.journal_id],
        album_messages=[w.message_id for w in works[1:] if w.journal_id])


def group_entries(entries: list[Any]) -> list[list[Any]]:
    """Journal entries (in resume order) grouped so that the parts of one album (same
    session key and ``work["album"]``) form one group at the place of its first part, and
    so do the started entries of one turn (same session key and ``run_id``: messages
    merged by ``collect`` or steered in): resumed as one turn, they get one notice and
    one reply, never a turn each that answers again what the first one answered."""
    groups: list[list[Any]] = []
    by_album: dict[tuple[str, ...], list[Any]] = {}
    for entry in entries:
        album = entry.work.get("album") if isinstance(entry.work, dict) else None
        run = entry.run_id if entry.started else None
        if not album and not run:
            groups.append([entry])
            continue
        key = (entry.session_key, "album", str(album)) if album else \
            (entry.session_key, "run", str(run))
        if key in by_album:
            by_album[key].append(entry)
        else:
            by_album[key] = [entry]
            groups.append(by_album[key])
    return groups


_MSG_FIELDS = ("channel", "text", "sender_id", "chat_type", "account_id", "peer_id",
               "group_id", "thread_id", "sender_name", "sender_username", "mentions_bot",
               "message_id", "reply_to", "received_at", "is_bot", "album_id")


def gated_row(msg: InboundMessage, key: str) -> dict[str, Any]:
    """The journal ``work`` of a held part: the message without ``raw`` and without bytes
    (its files by kind, name, size, claimed MIME and platform handle)."""
    media = [{"kind": m.kind, "name": m.name, "size": m.size, "mime": m.mime,
              "handle": m.handle} for m in msg.media]
    return {"album": key, "gated": {**{f: getattr(msg, f) for f in _MSG_FIELDS},
                                    "media": media}}


def is_gated(entry: Any) -> bool:
    return isinstance(entry.work, dict) and isinstance(entry.work.get("gated"), dict)


def gated_message(row: dict[str, Any], refetch: Callable[..., Any] | None) -> InboundMessage:
    """The held part of :func:`gated_row`; ``refetch(handle, name)`` (the adapter's
    ``media_fetch``) makes each file downloadable again. Raises TypeError/KeyError for a
    row this version cannot read."""
    msg = InboundMessage(**{f: row[f] for f in _MSG_FIELDS if f in row})
    for m in row.get("media") or []:
        handle, name = m.get("handle"), str(m["name"])
        fetch = refetch(handle, name) if refetch is not None and handle else _gone(name)
        msg.media.append(InboundMedia(kind=str(m["kind"]), name=name, fetch=fetch,
                                      size=m.get("size"), mime=m.get("mime"), handle=handle))
    return msg


def _gone(name: str):
    async def fetch(max_bytes: int) -> bytes:
        raise RuntimeError(f"{name!r} cannot be fetched again after the restart")
    return fetch


@dataclass(slots=True)
class _Album:
    session_key: str = ""
    works: list[UserWork] = field(default_factory=list)
    gated: list[tuple[InboundMessage, str | None]] = field(default_factory=list)
    open: bool = False
    last_at: float = 0.0
    task: asyncio.Task | None = None


class AlbumBuffer:
    """Parts waiting for the rest of their album. ``wait()``: ``media.album_wait`` now
    (read per album: a reload applies); ``ready(session_key, work)``: the merged work."""

    def __init__(self, clock: Clock, wait: Callable[[], float],
                 ready: Callable[[str, UserWork], None],
                 journal: Callable[[], Any] = lambda: None) -> None:
        self.clock = clock
        self.wait = wait
        self.ready = ready
        self.journal = journal  # the intake's JournalTracker (or None), read when needed
        self._albums: dict[str, _Album] = {}
        self._closed = False

    def is_open(self, key: str) -> bool:
        album = self._albums.get(key)
        return album is not None and album.open

    async def hold_gated(self, key: str, session_key: str, msg: InboundMessage,
                         dedupe: str | None) -> None:
        """A part refused only for lack of a mention: journaled (durable before the
        adapter confirms it) and kept until a part passes. A platform redelivery of a
        part already held is not held twice."""
        held = self._albums.get(key)
        if held is not None and any(m.message_id == msg.message_id for m, _ in held.gated):
            return
        journal, entry_id = self.journal(), None
        if journal is not None:
            entry_id = await journal.hold(session_key, gated_row(msg, key), dedupe)
        self.restore(key, session_key, msg, entry_id)
        log.info("inbound_album_held", channel=msg.channel, album=key,
                 session_key=session_key, message_id=msg.message_id, entry_id=entry_id,
                 reason="mention_required")

    def restore(self, key: str, session_key: str, msg: InboundMessage,
                entry_id: str | None) -> None:
        """Hold a part (at start: one the last run journaled while it waited)."""
        album = self._touch(key)
        album.session_key = album.session_key or session_key
        album.gated.append((msg, entry_id))

    def open(self, key: str) -> list[tuple[InboundMessage, str | None]]:
        """A part passed the access check: returns the held parts (with their journal
        entries) to accept now; :meth:`settle` each entry once its part is accepted."""
        album = self._touch(key)
        album.open = True
        gated, album.gated = album.gated, []
        return gated

    def settle(self, entry_id: str | None) -> None:
        """A held part's journal entry is finished (accepted as a part, or dropped)."""
        journal = self.journal()
        if journal is not None and entry_id:
            journal.journal.done(entry_id)

    def add(self, key: str, session_key: str, work: UserWork) -> int:
        """A journaled part; returns how many parts the album has."""
        album = self._touch(key)
        album.session_key = session_key
        album.works.append(work)
        return len(album.works)

    def resume(self, key: str, session_key: str, works: list[UserWork]) -> None:
        """Start-up: an album's journaled parts that never ran wait again, ahead of any
        part that arrived since (the platform delivers the rest after a restart), so
        the album still becomes one turn. They passed the access check: the album is
        open."""
        album = self._touch(key)
        album.session_key, album.open = session_key, True
        album.works[:0] = works

    def _touch(self, key: str) -> _Album:
        album = self._albums.get(key)
        if album is None:
            album = self._albums[key] = _Album()
            if not self._closed:  # after close: journaled parts wait for the next start
                album.task = asyncio.get_running_loop().create_task(self._timer(key))
        album.last_at = self.clock.monotonic()
        return album

    async def _timer(self, key: str) -> None:
        while True:
            album = self._albums.get(key)
            if album is None:
                return
            delay = album.last_at + self.wait() - self.clock.monotonic()
            if delay <= 0:
                break
            await self.clock.sleep(delay)
        self._flush(key)

    def _flush(self, key: str) -> None:
        album = self._albums.pop(key)
        for msg, entry_id in album.gated:  # no part of this album mentioned the bot
            log.info("inbound_denied", channel=msg.channel, account=msg.account_id,
                     sender_id=msg.sender_id, chat_type=msg.chat_type,
                     group_id=msg.group_id, reason="mention_required", action="context",
                     album=key)
            self.settle(entry_id)
        if not album.works:
            return
        log.info("inbound_album", album=key, session_key=album.session_key,
                 parts=len(album.works))
        try:
            self.ready(album.session_key, merge_works(album.works))
        except Exception:
            log.exception("inbound_album_failed", album=key)

    def close(self, journaled: bool) -> None:
        """Shutdown: stop the timers. Journaled parts are resumed (and merged) at the next
        start; without a journal they are lost, and that is logged."""
        self._closed = True
        for key, album in list(self._albums.items()):
            if album.task is not None:
                album.task.cancel()
            if album.works:
                log.warning("inbound_album_kept_for_restart" if journaled else
                            "inbound_album_dropped_at_shutdown", album=key,
                            session_key=album.session_key, parts=len(album.works))
        self._albums.clear()

