"""Discord catch-up: what the gateway never journaled is fetched again at start.

Discord has no acknowledgement for gateway events, and a fresh IDENTIFY after a crash
replays nothing: a MESSAGE_CREATE that arrived just before a ``kill -9`` — read from the
socket, not yet in the intake journal — or one sent while the gateway was down would be
lost. So the adapter keeps, per channel, the id of the last message whose ``on_message``
returned (the intake journal has it on disk by then: that is our acknowledgement), in
``<state_dir>/channels/discord-<account>-cursors.json`` (``{"<channel id>": "<message
id>"}``; with ``storage.backend: postgres`` the ``state_documents`` row
``discord/<account>/cursors.json``, so a replica taking the account over resumes from
the previous owner's cursors). At the first connect of a process it reads each channel's messages after that
id (``GET /channels/{id}/messages?after=``, oldest first, at most :data:`CATCH_UP_LIMIT`
per channel; Discord API reference: https://discord.com/developers/docs/resources/message
#get-channel-messages) and hands them to the normal inbound path; the gateway's inbound
dedupe drops any it had journaled after all. A corrupt cursor file disables only catch-up
(logged; its bytes are kept as ``<name>.corrupt-<stamp>``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import discord
import structlog

from runtime.storage.documents import DocumentRecords
from runtime.storage.embedded.document_file import DocumentFile

log = structlog.get_logger(__name__)

CATCH_UP_LIMIT = 50  # messages per channel (Discord's page is at most 100)
MAX_CHANNELS = 500  # channels remembered (the least recently advanced are forgotten)


class ChannelCursors:
    """The last acknowledged message id per channel id (both strings of snowflakes), in
    the file at ``path`` or in ``records`` (a ``runtime.storage.documents`` backend:
    PostgreSQL's ``state_documents``, so the replica that takes the account over catches
    up from where the previous owner stopped). Neither: memory only, no catch-up."""

    def __init__(self, path: Path | None, records: DocumentRecords | None = None) -> None:
        self.store: DocumentRecords | None = records if records is not None else (
            DocumentFile(path, durable=False) if path is not None else None)
        self.path = self.store.path if self.store is not None else None
        self._ids: dict[str, str] = {}
        if self.store is not None:
            self._load(self.store)

    def reload(self) -> None:
        """Read the cursors again (blocking): at each start, since a replica that owned
        the account meanwhile moved them."""
        if self.store is not None and getattr(self.store, "shared", False):
            self._ids = {}
            self._load(self.store)

    def fence(self, lease: str, replica: str, generation: int) -> None:
        """Writes from now on land only while ``replica`` holds ``lease`` with
        ``generation`` (PostgreSQL's ``PgDocument.fence``; files have no fence)."""
        fence = getattr(self.store, "fence", None)
        if fence is not None:
            fence(lease, replica, generation)

    def _load(self, store: DocumentRecords) -> None:
        try:
            raw = store.read()
            if raw is None:
                return
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or not all(
                    str(v).isdigit() for v in data.values()):
                raise ValueError("expected {\"<channel id>\": \"<message id>\"}")
            self._ids = {str(k): str(v) for k, v in data.items()}
        except (OSError, ValueError) as exc:
            kept = store.keep_aside() if not isinstance(exc, OSError) else None
            log.error("state_file_corrupt", owner="discord catch-up cursors",
                      path=str(store.path), error=str(exc)[:300],
                      effect="messages missed before this start are not fetched again",
                      fix=f"the bytes are kept in {kept}" if kept else "none needed")

    def items(self) -> list[tuple[str, str]]:
        return list(self._ids.items())

    def advance(self, channel_id: str, message_id: str) -> None:
        """``message_id`` of ``channel_id`` is journaled: remember it (never go back)."""
        if self.path is None or not message_id.isdigit():
            return
        current = self._ids.get(channel_id)
        if current is not None and int(current) >= int(message_id):
            return
        self._ids.pop(channel_id, None)
        self._ids[channel_id] = message_id
        while len(self._ids) > MAX_CHANNELS:
            self._ids.pop(next(iter(self._ids)))
        try:
            if isinstance(self.path, Path):
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.store.write(json.dumps(self._ids).encode())  # type: ignore[union-attr]
        except OSError as exc:
            log.error("discord_cursor_write_failed", path=str(self.path), error=str(exc))


async def catch_up(client: Any, cursors: ChannelCursors,
                   handle: Callable[[Any, Any], Awaitable[None]],
                   stash: Callable[[dict[str, Any]], None], account_id: str) -> int:
    """Fetch every remembered channel's messages after its cursor and pass each, oldest
    first, to ``handle(client, message)`` (the adapter's on_message path; ``stash`` keeps
    the raw payload for it). Returns how many were handed on. Never raises: a channel that
    cannot be read is logged and skipped."""
    total = 0
    for channel_id, after in cursors.items():
        try:
            rows = await client.http.logs_from(int(channel_id), CATCH_UP_LIMIT,
                                               after=int(after))
            channel = client.get_channel(int(channel_id)) or \
                await client.fetch_channel(int(channel_id))
        except Exception as exc:  # noqa: BLE001 - one unreadable channel skips only itself
            log.warning("discord_catch_up_failed", account_id=account_id,
                        channel_id=channel_id, error=f"{type(exc).__name__}: {exc}"[:300])
            continue
        rows = sorted((r for r in rows if isinstance(r, dict) and "id" in r),
                      key=lambda r: int(r["id"]))
        for row in rows:
            try:
                message = discord.Message(state=client._connection, channel=channel, data=row)
            except Exception as exc:  # noqa: BLE001 - a malformed payload is skipped
                log.warning("discord_message_malformed", account_id=account_id,
                            message_id=str(row.get("id")), error=str(exc)[:300])
                continue
            stash(row)
            await handle(client, message)
            total += 1
        if rows:
            log.info("discord_caught_up", account_id=account_id, channel_id=channel_id,
                     messages=len(rows), after=after)
    return total
