"""Embedded outbox: one JSON file per entry, ``<dir>/<id>.json`` (atomic write: temp +
fsync + rename), dead letters in ``<dir>/dead/``. An unreadable file is renamed to
``<id>.json.corrupt`` and reported by the outbox; the others are delivered."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from runtime.fsutil import atomic_write

if TYPE_CHECKING:
    from runtime.storage.outbox import Unreadable

T = TypeVar("T")


class OutboxFiles:
    """The :class:`runtime.storage.outbox.OutboxRecords` backend on files. One process
    owns ``dir`` (created if missing)."""

    def __init__(self, dir: Path) -> None:
        self.dir = self.path = Path(dir)
        self.dead_dir = self.dir / "dead"
        self.dir.mkdir(parents=True, exist_ok=True)

    def load(self, parse: Callable[[dict[str, Any]], T]) -> tuple[list[T], list[Unreadable]]:
        entries: list[T] = []
        bad: list[Unreadable] = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                entry = parse(json.loads(path.read_bytes()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                from runtime.storage.outbox import Unreadable
                kept = path.with_name(path.name + ".corrupt")
                os.replace(path, kept)
                bad.append(Unreadable(str(path), f"{type(e).__name__}: {e}", str(kept)))
                continue
            entries.append(entry)
        return entries, bad

    def _file(self, entry_id: str) -> Path:
        return self.dir / f"{entry_id}.json"

    def save(self, entry: dict[str, Any]) -> None:
        data = json.dumps(entry, ensure_ascii=False, indent=1).encode()
        atomic_write(self._file(entry["id"]), data)

    def delete(self, entry_id: str) -> None:
        self._file(entry_id).unlink(missing_ok=True)

    def bury(self, entry: dict[str, Any]) -> None:
        data = json.dumps(entry, ensure_ascii=False, indent=1).encode()
        atomic_write(self.dead_dir / f"{entry['id']}.json", data)
        self.delete(entry["id"])

    def adopt(self, parse: Callable[[dict[str, Any]], T]) -> list[T]:
        return []

    def read_all(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], list[str]]:
        """(pending, dead letters, unreadable file names), read without changing anything
        (for ``storage copy``)."""
        out: list[dict[str, dict[str, Any]]] = [{}, {}]
        bad: list[str] = []
        for i, folder in enumerate((self.dir, self.dead_dir)):
            for path in sorted(folder.glob("*.json")):
                try:
                    data = json.loads(path.read_bytes())
                    out[i][str(data["id"])] = data
                except (OSError, ValueError, KeyError, TypeError) as e:
                    bad.append(f"{path}: {type(e).__name__}: {e}")
        return out[0], out[1], bad
