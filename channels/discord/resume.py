"""Discord gateway RESUME across processes (issue 15 "Channel accounts").

Discord keeps a gateway session alive for a while after its connection drops and replays
every dispatch after a given sequence number to a client that sends op 6 RESUME
``{token, session_id, seq}`` on the session's ``resume_gateway_url``, ending with a
``RESUMED`` dispatch; a session it no longer knows is answered with op 9 Invalid Session
``d: false`` (Discord developer docs, "Gateway": Resuming; "Gateway Events": Resume,
Invalid Session). discord.py does exactly that inside one process
(``DiscordWebSocket.from_client(..., session=, sequence=, gateway=, resume=True)``), but
``Client.connect`` always starts with IDENTIFY. So:

- :class:`SessionTracker` follows the session the account's connection runs
  (``ws.session_id``, ``ws.gateway`` = resume_gateway_url) and its *acknowledged*
  sequence number: the highest ``s`` such that every dispatch up to it was handled — a
  MESSAGE_CREATE only once its ``on_message`` returned (journaled), everything else once
  parsed. It saves ``{"session_id", "seq", "resume_gateway_url"}`` to a store whenever that
  position moves (one write in flight, the newest wins): a file
  (``<state_dir>/channels/discord-<account>-resume.json``, :class:`ResumeFile`) on
  embedded storage, the lease-fenced ``cluster_channel_state`` row
  ``discord:<account>:resume`` with replicas (``gateway.cluster.accounts.OffsetStore``: a
  stale owner's writes are refused).
- :func:`run_gateway` is ``Client.connect(reconnect=False)`` that starts with RESUME when
  a position is known: discord.py's own ``from_client``/``resume``/``identify`` and its
  op 9 handling (which clears the session and raises ``ReconnectWebSocket(resume=False)``:
  the next round IDENTIFYs; the adapter then runs the REST catch-up).
- :func:`close_resumable`: a stop closes with 4000 instead of discord.py's 1000 (after
  which Discord invalidates the session), so a restart or the next owner RESUMEs too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import discord
import structlog
import yarl
from discord.gateway import DiscordWebSocket, ReconnectWebSocket

from runtime.storage.embedded.document_file import DocumentFile

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT = 60.0  # seconds for one handshake, as discord.py's Client.connect


@dataclass(frozen=True)
class ResumeState:
    """Where a gateway session stands: ``seq`` is the last acknowledged sequence number."""

    session_id: str
    seq: int
    url: str

    def to_json(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "seq": self.seq,
                "resume_gateway_url": self.url}

    @classmethod
    def from_json(cls, value: Any) -> ResumeState | None:
        """The state in ``value`` (a stored JSON object), None when it is not one."""
        if not isinstance(value, dict):
            return None
        sid, seq, url = value.get("session_id"), value.get("seq"), value.get(
            "resume_gateway_url")
        if not (isinstance(sid, str) and sid and isinstance(seq, int) and seq >= 0
                and isinstance(url, str) and url.startswith(("ws://", "wss://"))):
            return None
        return cls(sid, seq, url)


class ResumeFile:
    """The embedded store of one account's resume state (``load``/``save`` JSON)."""

    def __init__(self, path: Path) -> None:
        self.file = DocumentFile(path, durable=False)
        self.path = self.file.path

    async def load(self) -> Any:
        raw = await asyncio.to_thread(self.file.read)
        if raw is None:
            return None
        try:
            return json.loads(raw.decode("utf-8"))
        except ValueError as exc:
            log.error("state_file_corrupt", owner="discord resume state",
                      path=str(self.path), error=str(exc)[:300],
                      effect="the next connect identifies afresh (REST catch-up)")
            return None

    async def save(self, value: Any) -> None:
        def write() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.file.write(json.dumps(value).encode())
        try:
            await asyncio.to_thread(write)
        except OSError as exc:
            log.error("discord_resume_write_failed", path=str(self.path), error=str(exc))


class SessionTracker:
    """The acknowledged position of one account's gateway session, saved to ``store``
    (anything with ``async load() -> JSON`` and ``async save(JSON)``; None: memory only)."""

    def __init__(self, store: Any, account_id: str) -> None:
        self.store, self.account_id = store, account_id
        self.session: str | None = None
        self.url = ""
        self.high = 0  # highest sequence number seen in this session
        self.pending: dict[int, str] = {}  # seq -> message id whose on_message runs
        self._saved: ResumeState | None = None
        self._writer: asyncio.Task | None = None

    async def load(self) -> ResumeState | None:
        """The stored position (and adopt it), None when there is none or it is unusable."""
        if self.store is None:
            return self.position()
        try:
            state = ResumeState.from_json(await self.store.load())
        except Exception as exc:  # noqa: BLE001 - no state: identify afresh
            log.warning("discord_resume_load_failed", account_id=self.account_id,
                        error=f"{type(exc).__name__}: {exc}"[:300])
            return None
        if state is not None:
            self.session, self.url, self.high = state.session_id, state.url, state.seq
            self.pending.clear()
            self._saved = state
        return state

    def position(self) -> ResumeState | None:
        if self.session is None or not self.url:
            return None
        seq = min(self.pending) - 1 if self.pending else self.high
        return ResumeState(self.session, seq, self.url)

    def seen(self, ws: Any, message_id: str | None) -> None:
        """A dispatch is being parsed on ``ws`` (its ``sequence`` is the dispatch's ``s``);
        ``message_id``: a MESSAGE_CREATE whose handling acknowledges it (:meth:`done`)."""
        sid, seq = getattr(ws, "session_id", None), getattr(ws, "sequence", None)
        if sid is None or seq is None:
            return
        if sid != self.session:  # a new session (IDENTIFY): the old position is gone
            self.session, self.high = sid, 0
            self.pending.clear()
        self.url = str(ws.gateway)
        self.high = max(self.high, int(seq))
        if message_id is not None:
            self.pending[int(seq)] = message_id
        self._advance()

    def done(self, message_id: str) -> None:
        """The message's ``on_message`` returned (or it will never run)."""
        for seq in [s for s, m in self.pending.items() if m == message_id]:
            del self.pending[seq]
        self._advance()

    def _advance(self) -> None:
        state = self.position()
        if self.store is None or state is None or state == self._saved:
            return
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        while (state := self.position()) is not None and state != self._saved:
            self._saved = state
            try:
                await self.store.save(state.to_json())
            except Exception as exc:  # noqa: BLE001 - a lost save: more is replayed
                log.warning("discord_resume_save_failed", account_id=self.account_id,
                            error=f"{type(exc).__name__}: {exc}"[:300])

    async def flush(self) -> None:
        """Wait for the write in flight (stop, tests)."""
        if self._writer is not None:
            await asyncio.shield(self._writer)

    async def save_final(self) -> None:
        """At stop (the connection closed resumable, :func:`close_resumable`): store the
        position once more, so the next start or owner RESUMEs from it (a replica that
        lost the account is refused here by the fence, ``cluster_offset_fenced``)."""
        await self.flush()
        state = self.position()
        if self.store is None or state is None:
            return
        self._saved = state
        try:
            await self.store.save(state.to_json())
        except Exception as exc:  # noqa: BLE001 - the last stored position is replayed
            log.warning("discord_resume_save_failed", account_id=self.account_id,
                        error=f"{type(exc).__name__}: {exc}"[:300])


async def close_resumable(client: discord.Client) -> None:
    """Close ``client`` leaving its gateway session resumable: close code 4000 first
    (discord.py's ``close`` uses 1000, after which Discord invalidates the session)."""
    ws = client.ws
    if ws is not None and ws.open:
        await ws.close(code=4000)
    await client.close()


def track_parsers(client: discord.Client, tracker: SessionTracker) -> None:
    """Wrap every gateway parser so ``tracker`` sees each dispatch before it is parsed
    (wrap before ``guard_parsers``: a MESSAGE_CREATE that fails to parse never reaches
    ``on_message`` and is acknowledged here)."""
    parsers = client._connection.parsers

    def tracked(event: str, parse: Callable[[Any], None]) -> Callable[[Any], None]:
        def run(data: Any) -> None:
            mid = str(data.get("id")) if event == "MESSAGE_CREATE" and isinstance(
                data, dict) else None
            tracker.seen(client.ws, mid)
            try:
                parse(data)
            except Exception:
                if mid is not None:
                    tracker.done(mid)
                raise
        return run

    for event, parse in list(parsers.items()):
        parsers[event] = tracked(event, parse)


async def run_gateway(client: discord.Client, start: ResumeState | None,
                      may_resume: Callable[[], Awaitable[bool]] | None = None) -> None:
    """``client.connect(reconnect=False)``, but starting with RESUME of ``start`` when
    given. ``may_resume()`` is asked before any later in-process resume (a replica that
    lost the account must not take the session back). Raises what ``connect`` raises."""
    params: dict[str, Any] = {"initial": True, "shard_id": client.shard_id}
    if start is not None:
        params.update(session=start.session_id, sequence=start.seq, resume=True,
                      gateway=yarl.URL(start.url))
        log.info("discord_resume_attempt", session_id=start.session_id, seq=start.seq)
    while not client.is_closed():
        try:
            client.ws = await asyncio.wait_for(
                DiscordWebSocket.from_client(client, **params), CONNECT_TIMEOUT)
            params["initial"] = False
            while True:
                await client.ws.poll_event()
        except ReconnectWebSocket as exc:
            client.dispatch("disconnect")
            ws = client.ws
            params.update(sequence=ws.sequence, resume=exc.resume, session=ws.session_id)
            params.pop("gateway", None)
            if exc.resume:
                params["gateway"] = ws.gateway
                if may_resume is not None and not await may_resume():
                    await client.close()
                    raise ConnectionError("the account is no longer this process's")
            else:
                log.warning("discord_session_invalidated", session_id=ws.session_id,
                            action="identify afresh")
        except (OSError, discord.HTTPException, discord.GatewayNotFound,
                discord.ConnectionClosed, aiohttp.ClientError, TimeoutError) as exc:
            client.dispatch("disconnect")
            await client.close()
            if isinstance(exc, discord.ConnectionClosed) and exc.code == 1000:
                return
            raise
