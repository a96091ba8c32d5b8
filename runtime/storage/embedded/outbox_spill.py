"""Outbox spill file: writes a remote outbox store (PostgreSQL) refused until shutdown,
kept on local disk so the next start re-submits them (issue 15 "nothing accepted is
lost"). ``<state_dir>/outbox/pending-spill.jsonl``, one JSON object a line,
``{"op": "save" | "delete" | "bury", "entry": OutboxEntry.to_json()}``, written whole
(atomic: temp + fsync + rename, mode 0600). An unreadable file is renamed to
``pending-spill.jsonl.corrupt`` and reported by the outbox; nothing else is affected."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from runtime.fsutil import atomic_write

SPILL_NAME = "pending-spill.jsonl"
OPS = ("save", "delete", "bury")


def spill_path(dir: Path) -> Path:
    """The spill file of the outbox directory ``dir``."""
    return Path(dir) / SPILL_NAME


def write_spill(path: Path, writes: list[tuple[str, dict[str, Any]]]) -> None:
    """Replace ``path`` with ``writes`` ((op, entry json) pairs, in order). Raises OSError
    (``path`` unchanged)."""
    lines = [json.dumps({"op": op, "entry": entry}, ensure_ascii=False) + "\n"
             for op, entry in writes]
    atomic_write(path, "".join(lines).encode(), mode=0o600)


def read_spill(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The (op, entry json) pairs in ``path``; [] when there is no file. Raises ValueError
    (bad JSON, unknown op, entry without an id) or OSError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    for n, line in enumerate(data.decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            op, entry = item["op"], item["entry"]
            if op not in OPS or not isinstance(entry, dict) or not entry.get("id"):
                raise ValueError("not an outbox write")
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"line {n}: {type(e).__name__}: {e}") from None
        out.append((op, entry))
    return out


def set_aside(path: Path) -> Path:
    """Rename an unreadable spill file to ``<name>.corrupt``; returns the new path."""
    kept = path.with_name(path.name + ".corrupt")
    os.replace(path, kept)
    return kept
