"""Where a received file came from: ``<state_dir>/media/provenance.jsonl``, one line per
file stored in a workspace inbox (``{"agent", "path", "channel", "sender", "sha256"}``;
``path`` workspace-relative).

Why: a file a stranger sent is untrusted content even when an owner's later turn reads it;
the read tool (and attaching it to a message) asks :meth:`FileProvenance.taint` whether it
taints the turn (docs/exec.md "Tainted turns"), by path and by content (``sha256``: a copy
or a symlink has the same bytes); ``exec`` asks gateway/inbound/file_lines.py, which
reads the received files :meth:`FileProvenance.received` lists. The index lives in the state dir, out of
reach of the agent and its commands (the workspace is theirs to rewrite).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


class FileProvenance:
    """The append-only index; loaded on first use, safe to call from worker threads."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._by_path: dict[tuple[str, str], tuple[str, str]] | None = None
        # (agent, sha256) -> (channel, sender, rel of the received file)
        self._by_sha: dict[tuple[str, str], tuple[str, str, str]] = {}

    def _load(self) -> None:
        self._by_path = {}
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                e = json.loads(line)
                self._remember(e["agent"], e["path"], e["channel"], e["sender"],
                               e.get("sha256") or "")
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line after a crash: the rest still counts

    def _remember(self, agent: str, rel: str, channel: str, sender: str, sha: str) -> None:
        assert self._by_path is not None
        self._by_path[(agent, rel)] = (channel, sender)
        if sha:
            self._by_sha[(agent, sha)] = (channel, sender, rel)

    def record(self, agent: str, rel: str, channel: str, sender: str | None,
               sha256: str) -> None:
        """Note that ``sender`` on ``channel`` sent the file at ``rel`` of ``agent``'s
        workspace. A write failure is logged, never raised (the message still goes on)."""
        if not sender:
            return
        with self._lock:
            if self._by_path is None:
                self._load()
            if self._by_path.get((agent, rel)) == (channel, sender):
                return
            self._remember(agent, rel, channel, sender, sha256)
            line = json.dumps({"agent": agent, "path": rel, "channel": channel,
                               "sender": sender, "sha256": sha256}) + "\n"
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "a", encoding="utf-8") as fh:
                    fh.write(line)
            except OSError as exc:
                log.warning("media_provenance_write_failed", error=str(exc))

    def _found(self, agent: str, rel: str, sha256: str) -> tuple[str, str, str] | None:
        """(channel, sender, rel of the received file) by path, else by content."""
        with self._lock:
            if self._by_path is None:
                self._load()
            assert self._by_path is not None
            by_path = self._by_path.get((agent, rel))
            if by_path is not None:
                return (*by_path, rel)
            return self._by_sha.get((agent, sha256)) if sha256 else None

    def sender_of(self, agent: str, rel: str, sha256: str = "") -> tuple[str, str] | None:
        """(channel, sender id) of the file at ``rel`` (or with content ``sha256``)."""
        found = self._found(agent, rel, sha256)
        return None if found is None else (found[0], found[1])

    def received(self, agent: str) -> list[tuple[str, str, str]]:
        """Every file received for ``agent``: ``(rel, channel, sender)``, newest last."""
        with self._lock:
            if self._by_path is None:
                self._load()
            assert self._by_path is not None
            return [(rel, *who) for (a, rel), who in self._by_path.items() if a == agent]

    def taint(self, agent: str, rel: str,
              sender_taint: Callable[[str, str, str | None], str | None],
              canonical: Callable[[str, str], str], sha256: str = "") -> str | None:
        """Why reading ``rel`` (content key ``sha256``, "" unknown) taints a turn of
        ``agent`` ("file from telegram:42: inbox/…", "file from telegram:42: copy.txt
        (the content of inbox/…)"), or None: not a received file nor one with its bytes,
        or its sender is an owner. ``sender_taint``: gateway/approvals/service.py
        ``Approvals.sender_taint``; ``canonical(channel, sender)``: the sender's
        canonical id."""
        found = self._found(agent, rel, sha256)
        if found is None or sender_taint(agent, found[0], found[1]) is None:
            return None
        who = canonical(found[0], found[1])
        return (f"file from {who}: {rel}" if found[2] == rel
                else f"file from {who}: {rel} (the content of {found[2]})")
