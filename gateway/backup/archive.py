"""``tidegate backup create``: one ``.tar.gz`` of a consistent snapshot of the state dir.

Layout of the archive (gzip: the ``zstandard`` package is no dependency of tidegate, and
gzip's CRC catches a damaged stream on its own)::

    MANIFEST.json            first member: what is inside (below)
    state/<path>             every file, by its path inside the state dir

``MANIFEST.json``::

    {"format": "tidegate-backup", "version": 1, "created_at": RFC 3339, "tidegate": VER,
     "storage": "embedded", "state_dir": original path, "secrets": bool,
     "secrets_left_out": [path, ...],
     "files": [{"path", "kind": sqlite|pending|lines|file, "size": bytes, "sha256": hex}],
     "timeline": {"db": path, "pending": path|null, "sessions": N, "events": N,
                  "heads": {session_id: {"seq": N, "hash": hex}}} | null}

The archive is written to a temp file beside the destination and renamed into place,
mode 0600 (it holds transcripts; with ``include_secrets`` also the secrets, and says so).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.backup.snapshot import Item, plan, read_item

FORMAT = "tidegate-backup"
VERSION = 1
MANIFEST = "MANIFEST.json"
PREFIX = "state/"
NAME_PREFIX = "tidegate-backup-"
SUFFIX = ".tar.gz"


class BackupError(RuntimeError):
    """A backup could not be made (the message names the file and the cause)."""


@dataclass(slots=True)
class Created:
    """A finished backup: ``path``, ``bytes`` (archive size), ``files`` (count),
    ``secrets`` (included?), ``secrets_left_out`` (paths), ``timeline`` (manifest part)."""

    path: Path
    bytes: int
    files: int
    secrets: bool
    secrets_left_out: list[str] = field(default_factory=list)
    timeline: dict[str, Any] | None = None


def default_name(now: float) -> str:
    """``tidegate-backup-YYYYmmddTHHMMSSZ.tar.gz`` (UTC; sorts by time)."""
    return NAME_PREFIX + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)) + SUFFIX


def free_path(directory: Path, now: float) -> Path:
    """A not yet existing default-named file in ``directory`` (``-1``, ``-2`` ... when a
    backup of the same second exists)."""
    base = default_name(now)
    path, n = directory / base, 0
    while path.exists():
        n += 1
        path = directory / base.replace(SUFFIX, f"-{n}{SUFFIX}")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def timeline_summary(db: Path, pending: Path | None) -> dict[str, Any]:
    """Sessions, events and heads (``{session_id: {"seq", "hash"}}``) of a timeline
    database plus its pending log, as a restore will see them. Raises sqlite3.Error."""
    from runtime.timeline.pending import merged_heads, read_pending
    from runtime.timeline.verify import INFO_COLS
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        heads = {r[0]: r for r in conn.execute(f"SELECT {INFO_COLS} FROM timelines")}
    finally:
        conn.close()
    pend = read_pending(str(pending)) if pending is not None and pending.exists() else None
    if pend:
        heads = merged_heads(pend, heads)
    return {"sessions": len(heads), "events": sum(int(h[5]) for h in heads.values()),
            "heads": {sid: {"seq": int(h[5]), "hash": h[6]} for sid, h in sorted(heads.items())}}


def _items(state_dir: Path, timeline_db: Path | None, include_secrets: bool,
           exclude: tuple[Path, ...]) -> tuple[list[Item], list[str], str | None]:
    """The plan's items, with a timeline kept outside the state dir added as
    ``timeline.db``; and the timeline's path inside the archive (None: no timeline)."""
    p = plan(state_dir, include_secrets=include_secrets, exclude=exclude)
    items, tl_rel = p.items, None
    if timeline_db is not None and timeline_db.is_file():
        try:
            tl_rel = timeline_db.resolve().relative_to(state_dir.resolve()).as_posix()
        except ValueError:  # timeline.path outside the state dir
            tl_rel = "timeline.db"
            pend = Path(str(timeline_db) + "-pending")
            extra = [Item(tl_rel + "-pending", "pending", pend)] if pend.exists() else []
            items = [*extra, *items, Item(tl_rel, "sqlite", timeline_db)]
    return items, p.secrets_skipped, tl_rel


def create_backup(state_dir: Path, dest: Path, *, include_secrets: bool = False,
                  timeline_db: Path | None = None, exclude: tuple[Path, ...] = (),
                  now: float | None = None) -> Created:
    """Write the archive of ``state_dir`` to ``dest`` (see the module docstring).
    ``timeline_db``: the configured timeline database; ``exclude``: directories left out
    (the backup directory). Raises BackupError."""
    now = time.time() if now is None else now
    items, skipped, tl_rel = _items(state_dir, timeline_db, include_secrets, exclude)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".tidegate-backup-", dir=dest.parent) as tmp:
        stage = Path(tmp) / "state"
        files = _stage(items, stage)
        timeline = None
        if tl_rel is not None and (stage / tl_rel).exists():
            pend = stage / (tl_rel + "-pending")
            try:
                timeline = {"db": tl_rel, "pending": tl_rel + "-pending" if pend.exists()
                            else None, **timeline_summary(stage / tl_rel, pend)}
            except sqlite3.Error as exc:
                raise BackupError(f"{tl_rel}: cannot read the timeline copy: {exc}") from None
        manifest = {"format": FORMAT, "version": VERSION, "tidegate": _version(),
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
                    "storage": "embedded", "state_dir": str(state_dir),
                    "secrets": include_secrets, "secrets_left_out": skipped,
                    "files": files, "timeline": timeline}
        _write_tar(dest, stage, manifest, Path(tmp) / "archive.partial")
    return Created(dest, dest.stat().st_size, len(files), include_secrets, skipped, timeline)


def _stage(items: list[Item], stage: Path) -> list[dict[str, Any]]:
    """Copy every item under ``stage``; their manifest entries (path order)."""
    files = []
    for item in items:
        target = stage / item.rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if not read_item(item, target):
                continue
        except (OSError, sqlite3.Error) as exc:
            raise BackupError(f"{item.rel}: cannot be read: {exc}") from None
        files.append({"path": item.rel, "kind": item.kind, "size": target.stat().st_size,
                      "sha256": _sha256(target)})
    files.sort(key=lambda f: f["path"])
    return files


def _write_tar(dest: Path, stage: Path, manifest: dict[str, Any], partial: Path) -> None:
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
                tar.addfile(info, io.BytesIO(data))
                for entry in manifest["files"]:
                    src = stage / entry["path"]
                    info = tar.gettarinfo(str(src), arcname=PREFIX + entry["path"])
                    info.mode, info.uid, info.gid, info.uname, info.gname = 0o600, 0, 0, "", ""
                    with open(src, "rb") as fh:
                        tar.addfile(info, fh)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, dest)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise BackupError(f"{dest}: cannot be written: {exc.strerror or exc}") from None


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("tidegate")
    except Exception:  # noqa: BLE001
        return "0.0.0"
