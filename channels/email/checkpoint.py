"""The mailbox checkpoint: which mails were handed to the gateway, and the threads.

IMAP names a mail by ``(UIDVALIDITY, UID)``: UIDs only grow inside one UIDVALIDITY, and a
new UIDVALIDITY (the mailbox was rebuilt) makes every old UID meaningless (RFC 9051
section 2.3.1.1). The adapter hands the mails of the watched folder to the gateway in UID
order and, once ``on_message`` returned for one (the intake journal has it on disk by then:
our acknowledgement), moves ``uid`` to it. After a restart it asks the server for the
UIDs above ``uid`` only: nothing is handled twice and nothing in between is skipped.

The same document keeps what replies need after a restart: per thread the subject and the
``References`` chain, and which Message-IDs belong to which thread (a client that sends
only ``In-Reply-To`` still lands in its thread) — of mails the gateway accepted only: a
mail is remembered while the gateway decides (:meth:`Checkpoint.hold`, so a pairing
notice or a command's answer is threaded) and forgotten again when its sender was
refused (:meth:`Checkpoint.settle`): of a refused mail only the UID position is kept.
Stored as one JSON document:

``{"uidvalidity": int, "uid": int, "saved_at": epoch s, "threads": {root: {"subject",
"refs": [...]}}, "ids": {message_id: root}}``

in ``<state_dir>/channels/email-<account>-checkpoint.json``, or with ``storage.backend:
postgres`` the ``state_documents`` row ``email/<account>/checkpoint.json``. A corrupt
document disables only itself (logged, its bytes kept aside): the mailbox then starts
from the mails that arrive from now on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from runtime.storage.documents import DocumentRecords
from runtime.storage.embedded.document_file import DocumentFile

log = structlog.get_logger(__name__)

MAX_THREADS = 500  # threads remembered (the least recently used are forgotten)
MAX_IDS = 5000  # Message-ID -> thread entries remembered
MAX_REFS = 20  # References kept per thread (the root and the newest)


@dataclass
class Checkpoint:
    """The mailbox position and thread memory of one account (module docstring).
    ``store``: a :class:`DocumentRecords` backend, or None (memory only)."""

    store: DocumentRecords | None
    uidvalidity: int | None = None
    uid: int = 0
    saved_at: float = 0.0
    threads: dict[str, dict[str, Any]] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    # while a mail is held: its thread root and what it changed ({("thread"|"id", key):
    # the value before, None = absent}), undone by settle(keep=False), never saved
    _held: str | None = field(default=None, repr=False)
    _undo: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, store: DocumentRecords | Path | None) -> Checkpoint:
        """Load from ``store`` (a document backend, or a file path); never raises (a
        corrupt or unreadable document is logged and the checkpoint starts empty)."""
        if isinstance(store, Path):
            store = DocumentFile(store)
        cp = cls(store)
        if store is not None:
            cp._load(store)
        return cp

    def _load(self, store: DocumentRecords) -> None:
        try:
            raw = store.read()
            if raw is None:
                return
            data = json.loads(raw.decode("utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("uid"), int) or not \
                    isinstance(data.get("uidvalidity"), int | None):
                raise ValueError('expected {"uidvalidity": int, "uid": int, ...}')
            self.uidvalidity, self.uid = data["uidvalidity"], data["uid"]
            self.saved_at = float(data.get("saved_at") or 0.0)
            self.threads = {str(k): v for k, v in (data.get("threads") or {}).items()
                            if isinstance(v, dict)}
            self.ids = {str(k): str(v) for k, v in (data.get("ids") or {}).items()}
        except (OSError, ValueError) as exc:
            kept = store.keep_aside() if not isinstance(exc, OSError) else None
            if kept is None and not isinstance(exc, OSError):
                self.store = None  # never overwrite bytes we could not keep
            log.error("state_file_corrupt", owner="email checkpoint", path=str(store.path),
                      error=str(exc)[:300],
                      effect="the mailbox starts from mail that arrives from now on",
                      fix=f"the bytes are kept in {kept}" if kept else "none needed")

    def reset(self, uidvalidity: int, uid: int) -> None:
        """A new mailbox generation (first start, or UIDVALIDITY changed): start after
        ``uid`` (the threads are kept: Message-IDs do not change with UIDs)."""
        self.uidvalidity, self.uid = uidvalidity, uid

    def advance(self, uid: int, now: float) -> None:
        """Mail ``uid`` is handled: persist (never go back). Write errors are logged (the
        mail may then be handled again after a restart; the inbound dedupe drops it)."""
        if uid <= self.uid:
            return
        self.uid, self.saved_at = uid, now
        self.save()

    def save(self) -> None:
        """Write the document (what a held mail changed is left out). Never raises."""
        if self.store is None:
            return
        threads, ids = self._committed()
        data = {"uidvalidity": self.uidvalidity, "uid": self.uid, "saved_at": self.saved_at,
                "threads": threads, "ids": ids}
        try:
            if isinstance(self.store.path, Path):
                self.store.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.store.write(json.dumps(data).encode())
        except OSError as exc:
            log.error("email_checkpoint_write_failed", path=str(self.store.path),
                      error=str(exc))

    # -- threads ---------------------------------------------------------------------

    def thread_of(self, message_id: str, refs: list[str]) -> str:
        """The thread root of a mail with ``message_id`` whose References/In-Reply-To
        are ``refs`` (oldest first): a thread already known for one of them, else the
        oldest reference, else the mail itself."""
        for ref in reversed(refs):
            if ref in self.ids:
                return self.ids[ref]
        return refs[0] if refs else message_id

    def hold(self, root: str) -> None:
        """An inbound mail of thread ``root`` goes to the gateway: what :meth:`remember`
        changes in that thread from now on is kept in memory only, until :meth:`settle`."""
        self._held, self._undo = root, {}

    def settle(self, keep: bool) -> None:
        """The gateway's verdict on the held mail: ``keep`` (accepted) makes its changes
        part of the document; otherwise (a refused sender) they are undone."""
        undo, self._held, self._undo = self._undo, None, {}
        if not keep:
            _undo(undo, self.threads, self.ids)
        self._trim()

    def _committed(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """The threads and ids without a held mail's changes."""
        if not self._undo:
            return self.threads, self.ids
        threads, ids = dict(self.threads), dict(self.ids)
        _undo(self._undo, threads, ids)
        return threads, ids

    def _trim(self) -> None:
        while len(self.threads) > MAX_THREADS:
            self.threads.pop(next(iter(self.threads)))
        while len(self.ids) > MAX_IDS:
            self.ids.pop(next(iter(self.ids)))

    def remember(self, root: str, message_id: str, subject: str | None = None,
                 refs: list[str] | None = None) -> None:
        """Record ``message_id`` in thread ``root`` (its subject, if new; ``refs`` added to
        the chain). Saved with the next :meth:`advance` or :meth:`save`; in the thread of
        a held mail, only once :meth:`settle` kept it."""
        if self._held is not None and root == self._held:
            old = self.threads.get(root)
            self._undo.setdefault(("thread", root), None if old is None else
                                  {**old, "refs": list(old.get("refs", []))})
            self._undo.setdefault(("id", message_id), self.ids.get(message_id))
        thread = self.threads.pop(root, None) or {"subject": subject or "", "refs": []}
        if subject and not thread.get("subject"):
            thread["subject"] = subject
        chain = [r for r in thread.get("refs", []) if isinstance(r, str)]
        for ref in [*(refs or []), message_id]:
            if ref not in chain:
                chain.append(ref)
        thread["refs"] = chain[:1] + chain[1:][-(MAX_REFS - 1):] if chain else []
        self.threads[root] = thread
        self.ids.pop(message_id, None)
        self.ids[message_id] = root
        if self._held is None:  # a held mail's thread must not push others out
            self._trim()

    def thread(self, root: str | None) -> dict[str, Any] | None:
        """``{"subject", "refs"}`` of thread ``root``, or None when unknown."""
        return self.threads.get(root) if root else None


def _undo(undo: dict[tuple[str, str], Any], threads: dict[str, Any],
          ids: dict[str, Any]) -> None:
    """Put back the values ``undo`` recorded (None: the key was absent)."""
    for (kind, key), before in undo.items():
        table = threads if kind == "thread" else ids
        if before is None:
            table.pop(key, None)
        else:
            table[key] = before
