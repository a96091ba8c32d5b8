"""What a backup holds and how each file is read consistently while the gateway runs.

A walk over the state dir classifies every regular file (:func:`plan`):

- **SQLite databases** (the timeline, ``sessions.db``; recognised by their header) are
  copied through SQLite's online backup API (:func:`copy_sqlite`): a page-consistent copy
  even while the daemon commits, never a torn file. Their ``-journal``/``-wal``/``-shm``
  companions are left out (the copy is self-contained).
- **The timeline's pending log** (``timeline.db-pending``) is read *before* the database,
  so events flushed meanwhile are in the database copy and the rest in the log copy: the
  two together miss no acknowledged event (``runtime/timeline/pending.py``). Opening the
  restored database replays the log and skips what the database already has.
- **Append-only JSON lines** (transcripts, usage, cron run logs, the intake journal) are
  cut after their last complete line: a line being written is not yet acknowledged.
- Everything else (atomically replaced JSON, workspace files) is read as it is.
- Left out: the process's own runtime files (``gateway.lock``, ``gateway.json``, ``*.lock``,
  temp files of atomic writes, ``backup-last.json``), the backup directory itself, staging
  dirs and default-named archives of ``backup create`` and, unless secrets are included,
  the secret files (``tidegate.env``, ``gateway.token``, any ``*.env``, and their copies
  such as ``tidegate.env.bak``, ``tidegate.env~``; and a YAML file at the top, copies
  like ``config.yaml.bak`` included, that holds a literal secret instead of a ``${VAR}``
  reference: ``secrets.py``).
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from gateway.backup.secrets import holds_literal_secret

SQLITE_MAGIC = b"SQLite format 3\x00"
SECRET_FILES = frozenset({"tidegate.env", "gateway.token"})
RUNTIME_FILES = frozenset({"gateway.lock", "gateway.json", "gateway.tmp", "backup-last.json"})
SQLITE_SIDECARS = ("-journal", "-wal", "-shm")
PENDING_SUFFIX = "-pending"
STAGING_PREFIX = ".tidegate-backup-"  # a running create's staging dir
# a secret file and its copies: tidegate.env, tidegate.env.bak, tidegate.env~, .env.old,
# prod.env-2024, gateway.token.orig, #tidegate.env# ...
SECRET_SIBLING = re.compile(r"(?:\.env|^\.?env|^#?tidegate\.env|^gateway\.token)"
                            r"(?:[.~#_\-].*)?$")
# a YAML file and its copies: config.yaml, config.yaml.bak, config.yml~, config.yaml.orig
YAML_SIBLING = re.compile(r"\.ya?ml(?:[.~#_\-].*)?$")
_ARCHIVE = re.compile(r"tidegate-backup-\d{8}T\d{6}Z(?:-manual)?(?:-\d+)?\.tar\.gz")


@dataclass(slots=True)
class Item:
    """One file of the backup: ``rel`` (POSIX path inside the state dir), ``kind``
    (``sqlite`` | ``pending`` | ``lines`` | ``file``), ``path`` (where it is read)."""

    rel: str
    kind: str
    path: Path


@dataclass(slots=True)
class Plan:
    """The files to back up (pending logs first) and what was left out as secret."""

    items: list[Item]
    secrets_skipped: list[str]


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def _kind(path: Path) -> str | None:
    """The item kind of a file, or None when it is left out as a runtime file."""
    name = path.name
    if (name in RUNTIME_FILES or name.endswith((".lock", ".tmp"))
            or name.endswith(SQLITE_SIDECARS)):
        return None
    if name.endswith(PENDING_SUFFIX):
        return "pending"
    if name.endswith(".jsonl"):
        return "lines"
    return "sqlite" if _is_sqlite(path) else "file"


def _secret(path: Path, rel: str) -> bool:
    """A secret file (:data:`SECRET_SIBLING`), or a YAML file at the top of the state dir,
    copies included (:data:`YAML_SIBLING`), that holds a literal secret."""
    if SECRET_SIBLING.search(path.name):
        return True
    if YAML_SIBLING.search(path.name) and "/" not in rel:
        try:
            return holds_literal_secret(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return False
    return False


def plan(state_dir: Path, *, include_secrets: bool, exclude: tuple[Path, ...] = ()) -> Plan:
    """Walk ``state_dir`` (symlinks not followed) into a :class:`Plan`. ``exclude``:
    directories left out (the backup directory). Pending logs come first so they are
    read before their databases."""
    items: list[Item] = []
    skipped: list[str] = []
    excluded = {p.resolve() for p in exclude}
    for root, dirs, files in os.walk(state_dir):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if (here / d).resolve() not in excluded
                         and not (here / d).is_symlink()
                         and not d.startswith(STAGING_PREFIX))
        for name in sorted(files):
            path = here / name
            if path.is_symlink() or not path.is_file():
                continue
            rel = path.relative_to(state_dir).as_posix()
            kind = _kind(path)
            if kind is None or _ARCHIVE.fullmatch(name):  # a backup of ours is no state
                continue
            if not include_secrets and _secret(path, rel):
                skipped.append(rel)
                continue
            items.append(Item(rel, kind, path))
    items.sort(key=lambda i: (i.kind != "pending", i.rel))
    return Plan(items, skipped)


class WriteFailed(Exception):
    """Writing the copy (beside the destination) failed: the destination's disk is full
    or refuses writes. ``error`` is the OSError or sqlite3.Error, ``path`` the file."""

    def __init__(self, path: Path, error: BaseException) -> None:
        super().__init__(f"{path}: {error}")
        self.path = path
        self.error = error

    @property
    def reason(self) -> str:
        e = self.error
        return (e.strerror or str(e)) if isinstance(e, OSError) else str(e)


# extended SQLite codes of a failed write or open of the copy (not of the source)
_TARGET_CODES = frozenset({13, 14, 8, 778, 1034, 1546, 3338, 4874})  # FULL, CANTOPEN,
# READONLY, IOERR_WRITE, IOERR_FSYNC, IOERR_TRUNCATE, IOERR_DIR_FSYNC, IOERR_SEEK


def write_target(dest: Path, data: bytes) -> None:
    """Write ``data`` to the copy ``dest``. Raises WriteFailed."""
    try:
        dest.write_bytes(data)
    except OSError as exc:
        raise WriteFailed(dest, exc) from None


def read_item(item: Item, dest: Path) -> bool:
    """Copy ``item`` consistently to ``dest`` (see the module docstring). Returns False
    when the file vanished meanwhile (an atomic replace of a temp file). Raises OSError
    or sqlite3.Error (reading the source), WriteFailed (writing the copy)."""
    if item.kind == "sqlite":
        copy_sqlite(item.path, dest)
        return True
    try:
        data = item.path.read_bytes()
    except FileNotFoundError:
        return False
    if item.kind in ("lines", "pending") and data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]  # the torn last line was never acknowledged
    write_target(dest, data)
    return True


def copy_sqlite(src: Path, dest: Path) -> None:
    """A consistent copy of the database at ``src`` through the online backup API (one
    read transaction; writers wait for it, up to SQLite's busy timeout). Raises
    sqlite3.Error (the source), WriteFailed (the copy)."""
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=30.0)
    try:
        source.execute("PRAGMA busy_timeout=30000")
        backup_sqlite(source, dest)
    finally:
        source.close()


def backup_sqlite(source: sqlite3.Connection, dest: Path) -> None:
    """Copy the database of ``source`` (as of its open read transaction, if any) to a
    new file ``dest``. Raises sqlite3.Error (reading), WriteFailed (writing the copy)."""
    try:
        target = sqlite3.connect(dest)
    except sqlite3.Error as exc:
        raise WriteFailed(dest, exc) from None
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")  # the copy needs no sidecar file
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", None) in _TARGET_CODES:
            raise WriteFailed(dest, exc) from None
        raise
    finally:
        target.close()
