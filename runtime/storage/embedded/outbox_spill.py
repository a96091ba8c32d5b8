"""Outbox spill file: writes a remote outbox store (PostgreSQL) refused until shutdown,
kept on local disk so the next start re-submits them (issue 15 "nothing accepted is
lost"). ``<state_dir>/outbox/pending-spill.jsonl``, one JSON object a line,
``{"op": "save" | "delete" | "bury", "entry": OutboxEntry.to_json(), "since": <epoch s the
store first refused it, optional>}``, written whole
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


def encode_spill(writes: list[tuple[Any, ...]]) -> bytes:
    """The file's bytes for ``writes``: (op, entry json) or (op, entry json, since)."""
    lines = []
    for op, entry, *since in writes:
        item: dict[str, Any] = {"op": op, "entry": entry}
        if since and since[0] is not None:
            item["since"] = since[0]
        lines.append(json.dumps(item, ensure_ascii=False) + "\n")
    return "".join(lines).encode()


def write_spill(path: Path, writes: list[tuple[Any, ...]]) -> bytes:
    """Replace ``path`` with ``writes`` (in order; see :func:`encode_spill`); returns the
    bytes written. Raises OSError (``path`` unchanged)."""
    data = encode_spill(writes)
    atomic_write(path, data, mode=0o600)
    return data


def read_spill(path: Path) -> list[tuple[str, dict[str, Any], float | None]]:
    """The (op, entry json, since or None) triples in ``path``; [] when there is no file.
    Raises ValueError (bad JSON, unknown op, entry without an id) or OSError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[tuple[str, dict[str, Any], float | None]] = []
    for n, line in enumerate(data.decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            op, entry, since = item["op"], item["entry"], item.get("since")
            if op not in OPS or not isinstance(entry, dict) or not entry.get("id"):
                raise ValueError("not an outbox write")
            since = float(since) if since is not None else None
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"line {n}: {type(e).__name__}: {e}") from None
        out.append((op, entry, since))
    return out


def set_aside(path: Path) -> Path:
    """Rename an unreadable spill file to ``<name>.corrupt``; returns the new path."""
    kept = path.with_name(path.name + ".corrupt")
    os.replace(path, kept)
    return kept
