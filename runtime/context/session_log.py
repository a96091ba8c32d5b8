"""A session's transcript writer plus its bounded in-memory context tail.

``SessionLog`` owns one transcript writer plus a bounded in-memory tail, so a turn never
re-reads the file (the cost of a turn does not grow with the session's length).
``HeldLog`` buffers a turn's lines and writes them only on ``commit()`` — the heartbeat
uses it so an ack-only beat leaves the transcript byte-for-byte untouched.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from runtime.context.budget import estimate_tokens, repair_tool_pairs
from runtime.context.messages import message_from_entry
from runtime.providers.base import ChatMessage
from runtime.transcript import TranscriptWriter, iter_entries_reversed

log = structlog.get_logger(__name__)


class LogSink(Protocol):
    """Where a turn writes its transcript lines."""

    def append_message(self, message: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(slots=True)
class _Cached:
    entry_id: str
    msg: ChatMessage
    tokens: int
    before: int = 0  # tokens pushed before this entry (running total), for bisecting
    users: int = 0   # user messages pushed up to and including this entry (running)


class SessionLog:
    """One session's transcript writer plus its in-memory context tail.

    ``max_tokens`` bounds the cached tail (about 1.5x the model budget is plenty).
    """

    def __init__(self, path: Path | str, *, session_id: str, session_key: str, clock,
                 max_tokens: int = 200_000, cwd: str | None = None, writer: Any = None,
                 entries: Callable[[], Iterator[tuple[dict | None, str | None]]] | None = None
                 ) -> None:
        # ``writer``/``entries``: another transcript store's (runtime/storage/transcripts.py);
        # default the JSONL file at ``path``.
        self.path = path
        self.session_id = session_id
        self.writer = writer or TranscriptWriter(Path(path), session_id=session_id,
                                                 session_key=session_key, clock=clock, cwd=cwd)
        self._entries = entries
        self.max_tokens = max_tokens
        self._tail: deque[_Cached] = deque()
        self._tokens = 0
        self._pushed = 0  # running total of tokens ever pushed
        self._users = 0  # running count of user messages ever pushed (summaries excluded)
        self._loaded = False
        self._loading: asyncio.Future | None = None  # preload() in a worker thread

    def _load(self) -> None:
        """Fill the cache from the end of the transcript, reading backwards only until
        ``max_tokens`` of messages (or the latest compaction and what it kept) are in."""
        self.writer.open()
        picked: list[dict[str, Any]] = []
        compaction: dict[str, Any] | None = None
        tokens, skipped = 0, 0
        for entry, problem in self.entries_reversed():
            if entry is None:
                skipped += 1
                continue
            if compaction is None and entry.get("type") == "compaction":
                compaction = entry
                if not entry.get("firstKeptEntryId"):
                    break
                continue
            picked.append(entry)
            if compaction is not None and entry.get("id") == compaction["firstKeptEntryId"]:
                break  # the context restarts at the latest compaction
            msg = message_from_entry(entry)
            if msg is not None:
                tokens += estimate_tokens(msg)
                if tokens >= self.max_tokens and compaction is None:
                    break
        if skipped:
            log.warning("transcript_lines_skipped", path=str(self.path), count=skipped,
                        session_key=self.writer.session_key,
                        repair="torn or invalid lines left out of the context")
        picked.reverse()
        if compaction is not None:
            self._push("compaction", ChatMessage(
                role="user", content="[Summary of the earlier conversation]\n"
                + str(compaction.get("summary", ""))))
        loaded = [(str(e.get("id")), m) for e in picked
                  if (m := message_from_entry(e)) is not None]
        # Repair once at load (a crash can leave a call without its result); turns then
        # only ever append well-formed pairs, so per-turn context needs no repair pass.
        ids = {id(m): eid for eid, m in loaded}
        repaired = repair_tool_pairs([m for _, m in loaded])
        added = sum(1 for m in repaired if id(m) not in ids)
        if added or len(repaired) - added != len(loaded):
            log.warning("transcript_tool_pairs_repaired", session_key=self.writer.session_key,
                        path=str(self.path), results_added=added,
                        orphans_dropped=len(loaded) - (len(repaired) - added),
                        repair="a tool call without its result (an interrupted turn) was "
                               "completed with an error result in the context")
        for msg in repaired:
            self._push(ids.get(id(msg), ""), msg)
        self._loaded = True

    async def preload(self) -> None:
        """Fill the cached tail now if it is not loaded yet. A transcript in another store
        (PostgreSQL: every page is a round trip through its blocking bridge) is read in a
        worker thread, so a slow database never stalls the event loop and with it every
        other session's turn; a local JSONL file is read in place as before."""
        if self._loaded:
            return
        if self._entries is None:
            self._load()
            return
        if self._loading is None:
            self._loading = asyncio.ensure_future(asyncio.to_thread(self._load))
        try:
            await asyncio.shield(self._loading)
        finally:
            if self._loading is not None and self._loading.done():
                self._loading = None

    def entries_reversed(self) -> Iterator[tuple[dict[str, Any] | None, str | None]]:
        """The transcript's entries newest first (``(None, reason)`` for a bad line)."""
        if self._entries is not None:
            return self._entries()
        return iter_entries_reversed(Path(self.path))

    def _push(self, entry_id: str, msg: ChatMessage) -> None:
        tokens = estimate_tokens(msg)
        if msg.role == "user" and entry_id != "compaction":
            self._users += 1
        self._tail.append(_Cached(entry_id, msg, tokens, self._pushed, self._users))
        self._pushed += tokens
        self._tokens += tokens
        while self._tokens > self.max_tokens and len(self._tail) > 1:
            self._tokens -= self._tail.popleft().tokens

    def messages(self) -> list[ChatMessage]:
        """The cached tail as model messages (oldest first)."""
        if not self._loaded:
            self._load()
        return [c.msg for c in self._tail]

    def context(self, budget_tokens: int, max_user_turns: int = 0) -> list[ChatMessage]:
        """The newest cached messages within ``budget_tokens`` (oldest first), never
        starting with a tool result. ``max_user_turns`` > 0 also bounds the window to the
        newest that many user messages and everything after each (the history tail,
        ``agents.*.history_turns``); a compaction summary at the head of the cache is kept
        in front of a window that cut it off, when it fits. Walks back only as far as the
        window reaches: the cost does not grow with the number of cached messages."""
        if not self._loaded:
            self._load()
        # Entry i and everything after it cost _pushed - before(i): bisect for the first
        # entry that fits, so the cost does not grow with the number of cached messages.
        start = bisect.bisect_left(self._tail, self._pushed - budget_tokens,
                                   key=lambda c: c.before)
        if max_user_turns > 0 and self._users > max_user_turns:
            # The first entry whose running user count reaches the window is its oldest
            # user message (users counts up to and including each entry).
            start = max(start, bisect.bisect_left(self._tail, self._users - max_user_turns + 1,
                                                  key=lambda c: c.users))
        n = len(self._tail)
        while start < n and self._tail[start].msg.role == "tool":
            start += 1
        # From the right end: the cost is the window's length, not the cache's.
        window = [c.msg for c in itertools.islice(reversed(self._tail), n - start)]
        window.reverse()
        head = self._tail[0] if n else None
        if start > 0 and head is not None and head.entry_id == "compaction" and (
                self._pushed - self._tail[start].before + head.tokens <= budget_tokens
                if start < n else head.tokens <= budget_tokens):
            window.insert(0, head.msg)
        return window

    @property
    def tokens(self) -> int:
        """Estimated tokens of the cached context tail."""
        if not self._loaded:
            self._load()
        return self._tokens

    def apply_compaction(self, summary: str, keep_from: int, tokens_before: int
                         ) -> dict[str, Any]:
        """Replace the context before message ``keep_from`` with ``summary``.

        Appends a ``compaction`` entry (``summary``, ``firstKeptEntryId``, ``tokensBefore``)
        to the transcript — the file itself is never rewritten — and rebuilds the cached
        tail as [summary] + the kept messages. Raises IndexError for a bad index.
        """
        if not 0 < keep_from < len(self._tail):
            raise IndexError("keep_from must leave something to summarise and to keep")
        kept = list(self._tail)[keep_from:]
        entry = self.writer.append("compaction", {
            "summary": summary, "firstKeptEntryId": kept[0].entry_id,
            "tokensBefore": tokens_before})
        self._tail.clear()
        self._tokens = 0
        self._push("compaction", ChatMessage(
            role="user", content=f"[Summary of the earlier conversation]\n{summary}"))
        for c in kept:
            self._push(c.entry_id, c.msg)
        return entry

    def append_message(self, message: dict[str, Any]) -> dict[str, Any]:
        if not self._loaded:
            self._load()
        entry = self.writer.append_message(message)
        msg = message_from_entry(entry)
        if msg is not None:
            self._push(entry["id"], msg)
        return entry

    def append_entry(self, entry_type: str, body: dict[str, Any]) -> dict[str, Any]:
        if not self._loaded:
            self._load()
        return self.writer.append(entry_type, body)

    def begin_batch(self) -> None:
        """Hold this turn's transcript lines for one write at the next durability point."""
        self.writer.hold()

    def flush_batch(self, *, end: bool = False) -> None:
        """Write the held lines (one ``write(2)``); ``end`` stops holding."""
        self.writer.flush(end=end)

    async def settled(self) -> None:
        """Wait until the flushed lines are stored (a writer that defers its commit, the
        PostgreSQL one; a file is written at the flush)."""
        settled = getattr(self.writer, "settled", None)
        if settled is not None:
            await settled()

    def close(self) -> None:
        self.writer.close()


class HeldLog:
    """Buffers a turn's transcript lines; ``commit()`` writes them, ``discard()`` drops them.

    Entry ids and parentIds are assigned at commit time, so lines appended by anyone else
    meanwhile keep the chain intact.
    """

    def __init__(self, target: SessionLog) -> None:
        self.target = target
        self.held: list[dict[str, Any]] = []

    def append_message(self, message: dict[str, Any]) -> dict[str, Any]:
        self.held.append(message)
        return {"type": "message", "id": None, "message": message}

    def commit(self) -> list[dict[str, Any]]:
        self.target.begin_batch()
        try:
            written = [self.target.append_message(m) for m in self.held]
        finally:
            self.target.flush_batch(end=True)
        self.held = []
        return written

    def discard(self) -> int:
        n = len(self.held)
        self.held = []
        return n
