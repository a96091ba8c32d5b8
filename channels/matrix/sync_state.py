"""The Matrix account's sync position, kept across restarts (no replay, no gap).

``/sync`` hands out ``next_batch``: a token naming the point in the homeserver's event
stream after the response. The adapter saves it once every event of the response went
through ``on_message``/``on_event`` (the intake journal has them on disk by then: that
is the acknowledgement) and syncs from it at the next start, so the events before it are
not handed out again and the events after it all come. A crash between handing events
over and saving the token re-delivers that one response; the gateway's inbound dedupe
(event ids) drops what it journaled already.

The document also maps the rooms joined from a direct-chat invite (``is_direct``), which
the adapter treats as DMs, to the user they are with. Shape: ``{"next_batch": "<token>",
"direct_rooms": {"!id:hs": "@user:hs", ...}}``; kept in ``<state_dir>/channels/matrix-<account>-sync.json``, or with
``storage.backend: postgres`` in the ``state_documents`` row ``matrix/<account>/sync.json``
(a replica taking the account over syncs from where the previous owner stopped). A
corrupt document disables only itself: logged, its bytes kept aside, the next start
syncs afresh (history skipped).
"""

from __future__ import annotations

import json
from pathlib import Path

import structlog

from runtime.storage.documents import DocumentRecords

log = structlog.get_logger(__name__)

MAX_DIRECT_ROOMS = 5000


class SyncState:
    """``next_batch`` and the direct rooms of one account in ``store`` (a
    ``runtime.storage.documents`` backend: the file, or PostgreSQL's row). None: memory
    only (every start syncs afresh). Reads block (call ``load`` off the event loop);
    ``save`` is a small replace."""

    def __init__(self, store: DocumentRecords | None) -> None:
        self.store = store
        self.next_batch: str | None = None
        self.direct_rooms: dict[str, str] = {}  # DM room id -> the other user's id
        self._saved: bytes | None = None

    def load(self) -> None:
        """Read the document (blocking). A corrupt one is logged and set aside."""
        self.next_batch, self.direct_rooms = None, {}
        if self.store is None:
            return
        try:
            raw = self.store.read()
            if raw is None:
                return
            data = json.loads(raw.decode("utf-8"))
            token, rooms = data.get("next_batch"), data.get("direct_rooms", {})
            if not isinstance(token, str) or not isinstance(rooms, dict) or not all(
                    isinstance(v, str) for v in rooms.values()):
                raise ValueError('expected {"next_batch": "<token>", "direct_rooms": '
                                 '{"<room id>": "<user id>"}}')
            self.next_batch, self.direct_rooms, self._saved = token, rooms, raw
        except (OSError, ValueError, AttributeError) as exc:
            kept = self.store.keep_aside() if not isinstance(exc, OSError) else None
            log.error("state_file_corrupt", owner="matrix sync position",
                      path=str(self.store.path), error=str(exc)[:300],
                      effect="this start syncs afresh: messages sent while the gateway "
                             "was down are not answered",
                      fix=f"the bytes are kept in {kept}" if kept else "none needed")

    def add_direct(self, room_id: str, user_id: str) -> None:
        """Remember ``room_id`` as the DM with ``user_id`` (saved with the next
        ``save``)."""
        self.direct_rooms.pop(room_id, None)
        self.direct_rooms[room_id] = user_id
        while len(self.direct_rooms) > MAX_DIRECT_ROOMS:
            self.direct_rooms.pop(next(iter(self.direct_rooms)))

    def room_of(self, user_id: str) -> str | None:
        """The most recent DM room with ``user_id``, or None."""
        for room_id, user in reversed(self.direct_rooms.items()):
            if user == user_id:
                return room_id
        return None

    def save(self, next_batch: str) -> None:
        """Remember ``next_batch`` (every event before it is handed over). Raises
        nothing: a failed write is logged (the next start re-reads a little)."""
        self.next_batch = next_batch
        if self.store is None:
            return
        data = json.dumps({"next_batch": next_batch,
                           "direct_rooms": self.direct_rooms}).encode()
        if data == self._saved:
            return
        try:
            path = self.store.path
            if isinstance(path, Path):
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.store.write(data)
            self._saved = data
        except OSError as exc:
            log.error("matrix_sync_state_write_failed", path=str(self.store.path),
                      error=str(exc))
