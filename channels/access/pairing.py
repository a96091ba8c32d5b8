"""DM pairing: unknown senders get a one-time code; the owner approves it from the CLI.

Used by DM policy ``pairing`` (channels/access/policy.py). State is one JSON document per channel
in a :class:`runtime.storage.pairing.PairingRecords` store (default: the file
``<state_dir>/pairing/<channel>.json``; PostgreSQL: table ``pairing``)::

    {"pending": [{"code", "account_id", "sender_id", "sender_name",
                  "created_at", "expires_at"}],          # RFC 3339 UTC
     "approved": [{"account_id", "sender_id", "sender_name", "approved_at"}]}

The daemon and the CLI use the store at the same time: writers take an exclusive ``flock`` on
``<channel>.lock``, re-read the file, change it and replace it atomically; readers re-read a
file whenever its mtime/size/inode changes. Codes: 8 characters from an alphabet without
0/O/1/I, valid for 1 hour, at most 3 pending per channel (the oldest is evicted).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from runtime.clock import Clock, parse_iso, utc_iso
from runtime.state_files import clear_problem, report_corrupt
from runtime.storage.embedded.pairing_files import PairingFiles
from runtime.storage.pairing import PairingRecords

log = structlog.get_logger(__name__)

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8
CODE_TTL = 3600.0  # seconds
MAX_PENDING = 3
_CHANNEL_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


@dataclass(frozen=True, slots=True)
class PairingRequest:
    """A pending (or just approved) pairing. Times are epoch seconds. ``is_new`` is False
    when ``request`` returned an existing pending code for the same sender."""

    code: str
    channel: str
    account_id: str
    sender_id: str
    sender_name: str | None
    created_at: float
    expires_at: float
    is_new: bool = False


def _new_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


class PairingUnavailable(RuntimeError):
    """The channel's pairing file is corrupt: pairing on that channel is disabled until it
    is fixed (the message names the file and the fix)."""


class PairingStore:
    """Pairing codes and approved senders under ``<state_dir>/pairing/``.

    Methods are synchronous and do small file I/O. Raises ValueError for a channel name that
    is not ``[a-z0-9_-]`` (it becomes a file name), OSError when the files cannot be written.
    A channel whose file is corrupt is disabled alone (``runtime.state_files``): nobody
    counts as approved there, writes raise :class:`PairingUnavailable` instead of
    replacing the file, and it works again as soon as the file parses.
    """

    def __init__(self, state_dir: Path, clock: Clock,
                 problems: list[str] | None = None,
                 records: PairingRecords | None = None) -> None:
        self.dir = Path(state_dir) / "pairing"
        self.records: PairingRecords = records if records is not None else \
            PairingFiles(self.dir)
        self._clock = clock
        self._cache: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._problems = problems
        self._broken: dict[str, str] = {}  # channel -> problem line

    def check(self) -> list[str]:
        """Read every channel's document now (at start), so a corrupt one is reported at
        once rather than at its first use. Returns the problem lines."""
        for channel in self.records.channels():
            if _CHANNEL_RE.match(channel):
                self._read(channel)
        return list(self._broken.values())

    # --- documents --------------------------------------------------------------------------

    @staticmethod
    def _check_name(channel: str) -> str:
        if not _CHANNEL_RE.match(channel):
            raise ValueError(f"invalid channel name {channel!r}")
        return channel

    def _read(self, channel: str) -> dict[str, Any]:
        """The channel's state, re-read only when the document changed."""
        sig = self.records.signature(self._check_name(channel))
        if sig is None:
            self._cache.pop(channel, None)
            if channel in self._broken:  # moved away: a fresh start
                clear_problem(self._problems, self._broken.pop(channel))
            return {"pending": [], "approved": []}
        cached = self._cache.get(channel)
        if cached is not None and cached[0] == sig:
            return cached[1]
        where = self.records.where(channel)
        try:
            data = json.loads(self.records.read(channel) or b"")
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            data.setdefault("pending", [])
            data.setdefault("approved", [])
        except (OSError, ValueError) as e:
            if channel not in self._broken:
                self._broken[channel] = report_corrupt(
                    f"pairing ({channel})", where, f"{type(e).__name__}: {e}",
                    problems=self._problems,
                    effect=f"pairing on {channel} is disabled: no sender counts as approved "
                           "and no code is issued; the file is not overwritten",
                    fix="repair the JSON or move the file away (approvals in it are lost)")
            data = {"pending": [], "approved": []}
        else:
            if channel in self._broken:
                clear_problem(self._problems, self._broken.pop(channel))
                log.info("pairing_file_recovered", channel=channel, path=where)
        self._cache[channel] = (sig, data)
        return data

    @contextmanager
    def _locked(self, channel: str) -> Iterator[dict[str, Any]]:
        """Exclusive read-modify-write of one channel's document (across processes)."""
        with self.records.locked(self._check_name(channel)) as write:
            self._cache.pop(channel, None)  # always re-read under the lock
            data = json.loads(json.dumps(self._read(channel)))  # private copy
            if channel in self._broken:
                raise PairingUnavailable(self._broken[channel])
            data["pending"] = [p for p in data["pending"] if not self._expired(p)]
            yield data
            write(json.dumps(data, ensure_ascii=False, indent=1).encode())
        self._cache.pop(channel, None)

    def _expired(self, p: dict[str, Any]) -> bool:
        return parse_iso(p["expires_at"]) <= self._clock.time()

    @staticmethod
    def _to_request(channel: str, p: dict[str, Any], is_new: bool = False) -> PairingRequest:
        return PairingRequest(code=p["code"], channel=channel, account_id=p["account_id"],
                              sender_id=p["sender_id"], sender_name=p.get("sender_name"),
                              created_at=parse_iso(p["created_at"]),
                              expires_at=parse_iso(p["expires_at"]), is_new=is_new)

    # --- API --------------------------------------------------------------------------------

    def request(self, channel: str, account_id: str, sender_id: str,
                sender_name: str | None = None) -> PairingRequest:
        """The pending code for this sender, creating one if needed (``is_new`` True).

        A fourth pending sender evicts the oldest pending request of the channel."""
        with self._locked(channel) as data:
            for p in data["pending"]:
                if p["account_id"] == account_id and p["sender_id"] == sender_id:
                    return self._to_request(channel, p)
            now = self._clock.time()
            taken = {p["code"] for p in data["pending"]}
            code = _new_code()
            while code in taken:
                code = _new_code()
            entry = {"code": code, "account_id": account_id, "sender_id": sender_id,
                     "sender_name": sender_name, "created_at": utc_iso(now),
                     "expires_at": utc_iso(now + CODE_TTL)}
            pending = sorted(data["pending"], key=lambda p: p["created_at"])
            while len(pending) >= MAX_PENDING:
                old = pending.pop(0)
                log.info("pairing_evicted", channel=channel, sender_id=old["sender_id"])
            data["pending"] = pending + [entry]
        log.info("pairing_requested", channel=channel, account_id=account_id,
                 sender_id=sender_id)
        return self._to_request(channel, entry, is_new=True)

    def approve(self, channel: str, code: str) -> PairingRequest | None:
        """Approve the pending request with ``code`` (case-insensitive, spaces/dashes
        ignored). Returns it, or None when no unexpired request has that code."""
        wanted = re.sub(r"[\s-]", "", code).upper()
        with self._locked(channel) as data:
            match = next((p for p in data["pending"] if p["code"] == wanted), None)
            if match is None:
                return None
            data["pending"].remove(match)
            data["approved"] = [a for a in data["approved"]
                                if (a["account_id"], a["sender_id"])
                                != (match["account_id"], match["sender_id"])]
            data["approved"].append({"account_id": match["account_id"],
                                     "sender_id": match["sender_id"],
                                     "sender_name": match.get("sender_name"),
                                     "approved_at": utc_iso(self._clock.time())})
        log.info("pairing_approved", channel=channel, account_id=match["account_id"],
                 sender_id=match["sender_id"])
        return self._to_request(channel, match)

    def list_pending(self, channel: str | None = None) -> list[PairingRequest]:
        """Unexpired pending requests of ``channel`` (or of every channel), oldest first."""
        channels = [channel] if channel is not None else self.records.channels()
        out = [self._to_request(ch, p) for ch in channels
               for p in self._read(ch)["pending"] if not self._expired(p)]
        return sorted(out, key=lambda r: r.created_at)

    def list_approved(self, channel: str) -> list[dict[str, Any]]:
        """Approved senders of ``channel``: dicts with account_id, sender_id, sender_name,
        approved_at (RFC 3339)."""
        return [dict(a) for a in self._read(channel)["approved"]]

    def is_approved(self, channel: str, account_id: str, sender_id: str) -> bool:
        """True when the sender was approved on this channel account. Cheap: one ``stat``
        unless the file changed. Matches the ``is_paired`` callback of check_access."""
        return any(a["account_id"] == account_id and a["sender_id"] == sender_id
                   for a in self._read(channel)["approved"])

    def revoke(self, channel: str, sender_id: str) -> bool:
        """Remove the sender's approvals (all accounts) and pending codes on ``channel``.
        Returns True when something was removed."""
        who = sender_id.strip().lower()  # ids as typed by a person: case is not meaningful
        with self._locked(channel) as data:
            before = len(data["approved"]) + len(data["pending"])
            data["approved"] = [a for a in data["approved"] if a["sender_id"].lower() != who]
            data["pending"] = [p for p in data["pending"] if p["sender_id"].lower() != who]
            removed = before != len(data["approved"]) + len(data["pending"])
        if removed:
            log.info("pairing_revoked", channel=channel, sender_id=sender_id)
        return removed
