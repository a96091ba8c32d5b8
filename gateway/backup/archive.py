"""``tidegate backup create``: one ``.tar.gz`` of the state dir. Made by the running
gateway, the changing files are taken at one instant (``cut.py``: the archive is what a
crash at that instant would have left); made without one, each file is read consistently
on its own (``snapshot.py``), one after another.

Layout of the archive (gzip: the ``zstandard`` package is no dependency of tidegate, and
gzip's CRC catches a damaged stream on its own)::

    MANIFEST.json            first member: what is inside (below)
    state/<path>             every file, by its path inside the state dir

``MANIFEST.json``::

    {"format": "tidegate-backup", "version": 1, "created_at": RFC 3339, "tidegate": VER,
     "storage": "embedded" | "postgres", "state_dir": original path, "secrets": bool,
     "scheduled": bool (made by backup.schedule: rotation may delete it; absent in
                  archives of older versions),
     "secrets_left_out": [path, ...],
     "files": [{"path", "kind": sqlite|pending|lines|file, "size": bytes, "sha256": hex}],
     "cut": {"at": RFC 3339, "hold_ms": ms} | null (null: no running gateway, files
            read one after another),
     "dirs": {path: permission bits},
     "timeline": {"db": path, "pending": path|null, "sessions": N, "events": N,
                  "heads": {session_id: {"seq": N, "hash": hex}}} | null,
     "postgres": {... see pgdump.py; each table also "size", "sha256"} (postgres only)}

On PostgreSQL storage the archive also holds ``postgres/<table>.copy`` (one binary COPY
file per table of the schema, from one snapshot: ``pgdump.py``) and the timeline part
describes the database's timeline (``"db": "postgres"``).

The archive is written to a temp file beside the destination and moved into place,
mode 0600 (it holds transcripts; with ``include_secrets`` also the secrets, and says so).
An existing destination is never replaced unless ``overwrite`` is given, and then only a
regular file (never a device node, FIFO, directory or symlink); without ``overwrite`` the
final step is a hard link, which fails rather than replace a file that appeared meanwhile.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import sqlite3
import stat
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.backup.names import numbered
from gateway.backup.snapshot import Item, WriteFailed, plan, read_item
from gateway.backup.staging import staging

FORMAT = "tidegate-backup"
VERSION = 1
MANIFEST = "MANIFEST.json"
PREFIX = "state/"


class BackupError(RuntimeError):
    """A backup could not be made (the message names the file and the cause)."""


class BackupRefused(BackupError):
    """A backup refused before anything was read or written (a ``--to`` that exists or
    lies inside the state dir): a usage error, not a failed backup."""


@dataclass(slots=True)
class Created:
    """A finished backup: ``path``, ``bytes`` (archive size), ``files`` (count: the state
    files plus, on PostgreSQL, the COPY file of each table, as ``backup verify`` counts),
    ``secrets`` (included?), ``secrets_left_out`` (paths), ``timeline`` (manifest part)."""

    path: Path
    bytes: int
    files: int
    secrets: bool
    secrets_left_out: list[str] = field(default_factory=list)
    timeline: dict[str, Any] | None = None
    cut: dict[str, Any] | None = None  # {"at", "hold_ms"}: made at one instant


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
    ``timeline.db``; and the timeline's path inside the archive (None: no timeline).
    A stray ``timeline.db`` (and its pending log) inside the state dir is left out then:
    the configured timeline is the one that counts, and one archive name holds one file."""
    p = plan(state_dir, include_secrets=include_secrets, exclude=exclude)
    items, tl_rel = p.items, None
    if timeline_db is not None and timeline_db.is_file():
        try:
            tl_rel = timeline_db.resolve().relative_to(state_dir.resolve()).as_posix()
        except ValueError:  # timeline.path outside the state dir
            tl_rel = "timeline.db"
            ours = {tl_rel, tl_rel + "-pending"}
            items = [i for i in items if i.rel not in ours]
            pend = Path(str(timeline_db) + "-pending")
            extra = [Item(tl_rel + "-pending", "pending", pend)] if pend.exists() else []
            items = [*extra, *items, Item(tl_rel, "sqlite", timeline_db)]
    return items, p.secrets_skipped, tl_rel


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
    except ValueError:
        return False
    return True


def _check_dest(state_dir: Path, dest: Path, exclude: tuple[Path, ...]) -> None:
    """BackupError when ``dest`` is inside the state dir but not in an excluded
    directory (the backup dir): the next backup would take it in."""
    where = dest.parent.resolve() / dest.name
    if _inside(where, state_dir.resolve()) and not any(
            _inside(where, e.resolve()) for e in exclude):
        raise BackupRefused(f"{dest}: inside the state dir {state_dir}, where the next backup "
                          "would take it in: write it outside the state dir (or into the "
                          "backup dir)")


def check_state_dir(state_dir: Path) -> None:
    """BackupError when ``state_dir`` is missing or no directory (a wrong config, another
    user's HOME): an empty archive would look like a good backup."""
    if not state_dir.is_dir():
        what = "does not exist" if not state_dir.exists() else "is not a directory"
        raise BackupError(f"{state_dir}: the state dir {what}: nothing to back up (check "
                          "gateway.state_dir, --config and the user this runs as)")


def _check_existing(dest: Path, overwrite: bool) -> None:
    """BackupError when something is at ``dest``: anything but a regular file always,
    a regular file unless ``overwrite``."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return
    except OSError as exc:  # a parent that is no directory, or cannot be searched
        raise BackupError(f"{dest}: cannot be written: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a symlink" if stat.S_ISLNK(st.st_mode) else "a directory"
                if stat.S_ISDIR(st.st_mode) else "not a regular file")
        raise BackupRefused(f"{dest}: exists and is {kind}: never replaced by a backup "
                            "(choose a new file name)")
    if not overwrite:
        raise BackupRefused(f"{dest}: exists: not replaced (choose a new file name, or "
                            "--force to replace it)")


def _check_unique(files: list[dict[str, Any]]) -> None:
    """BackupError when two manifest entries share a path (verify would reject it)."""
    seen: set[str] = set()
    for f in files:
        if f["path"] in seen:
            raise BackupError(f"{f['path']}: twice in the backup (two sources for one name)")
        seen.add(f["path"])


def create_backup(state_dir: Path, dest: Path, *, include_secrets: bool = False,
                  timeline_db: Path | None = None, exclude: tuple[Path, ...] = (),
                  now: float | None = None, postgres_dsn: str | None = None,
                  overwrite: bool = False, cut: Any = None,
                  unique: bool = False, scheduled: bool = False) -> Created:
    """Write the archive of ``state_dir`` to ``dest`` (see the module docstring).
    ``timeline_db``: the configured timeline database; ``exclude``: directories left out
    (the backup directory); ``postgres_dsn``: storage is PostgreSQL, snapshot its schema
    too; ``overwrite``: an existing regular file at ``dest`` may be replaced; ``cut``:
    ``(state_dir, items) -> cut.Cut``, the running gateway's cut (None: each file on its
    own); ``unique``: ``dest`` is a default name, and when another backup took it
    meanwhile (two at once) the next free ``-1``, ``-2`` ... name is used (see
    ``Created.path``); ``scheduled``: recorded in the manifest (only such archives are
    rotated). Raises BackupError (a missing state dir, an existing ``dest``: before anything
    is made; a write that fails beside ``dest``: ``"<dest>: cannot be written: ..."``,
    nothing left behind)."""
    now = time.time() if now is None else now
    check_state_dir(state_dir)
    _check_dest(state_dir, dest, exclude)
    _check_existing(dest, overwrite)
    try:
        return _create(state_dir, dest, include_secrets, timeline_db, exclude, now,
                       postgres_dsn, overwrite, cut, unique, scheduled)
    except BackupRefused as exc:  # found at the end (a file appeared): it was attempted
        raise BackupError(str(exc)) from None
    except OSError as exc:  # a directory that cannot be made, a full disk, ...
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(dest) \
            else ""
        raise BackupError(f"{dest}: cannot be written: {exc.strerror or exc}{where}") \
            from None


def _create(state_dir: Path, dest: Path, include_secrets: bool, timeline_db: Path | None,
            exclude: tuple[Path, ...], now: float, postgres_dsn: str | None,
            overwrite: bool, cut: Any, unique: bool = False,
            scheduled: bool = False) -> Created:
    items, skipped, tl_rel = _items(state_dir, None if postgres_dsn else timeline_db,
                                    include_secrets, exclude)
    if not items and not skipped and not postgres_dsn:
        raise BackupError(f"{state_dir}: holds no files of a gateway: nothing to back up "
                          "(check gateway.state_dir, --config and the user this runs as)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with staging(dest.parent) as tmp:
        stage = Path(tmp) / "state"
        pg = _dump_postgres(postgres_dsn, Path(tmp)) if postgres_dsn else None
        taken = cut(state_dir, items) if cut is not None else None
        try:
            if taken is not None:
                items = sorted([*items, *taken.extra], key=lambda i: i.kind != "sqlite")
            files = _stage(items, stage, dest, taken)
        finally:
            if taken is not None:
                taken.close()
        _check_unique(files)
        timeline = pg.pop("timeline") if pg else None
        if tl_rel is not None and (stage / tl_rel).exists():
            pend = stage / (tl_rel + "-pending")
            try:
                timeline = {"db": tl_rel, "pending": tl_rel + "-pending" if pend.exists()
                            else None, **timeline_summary(stage / tl_rel, pend)}
            except sqlite3.Error as exc:
                raise BackupError(f"{tl_rel}: cannot read the timeline copy: {exc}") from None
        manifest = {"format": FORMAT, "version": VERSION, "tidegate": _version(),
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
                    "storage": "postgres" if pg else "embedded", "state_dir": str(state_dir),
                    "secrets": include_secrets, "secrets_left_out": skipped,
                    "scheduled": scheduled,
                    "files": files, "timeline": timeline,
                    "cut": taken.manifest() if taken is not None else None,
                    "dirs": _dir_modes(state_dir, files)}
        if pg:
            manifest["postgres"] = pg
        dest = _write_tar(dest, stage, manifest, Path(tmp) / "archive.partial",
                          overwrite, unique)
    count = len(files) + len((pg or {}).get("tables", []))  # as verify counts them
    return Created(dest, dest.stat().st_size, count, include_secrets, skipped, timeline,
                   manifest["cut"])


def _dir_modes(state_dir: Path, files: list[dict[str, Any]]) -> dict[str, int]:
    """``{dir path: permission bits}`` of every directory above a file of the backup (a
    restore gives them back)."""
    modes: dict[str, int] = {}
    for f in files:
        for parent in Path(f["path"]).parents:
            rel = parent.as_posix()
            if rel == "." or rel in modes:
                continue
            try:
                modes[rel] = (state_dir / rel).stat().st_mode & 0o777
            except OSError:
                modes[rel] = 0o700
    return dict(sorted(modes.items()))


def _dump_postgres(dsn: str, tmp: Path) -> dict[str, Any]:
    """The schema's snapshot under ``tmp/postgres/``: the manifest's ``"postgres"`` part
    (each table with size and SHA-256) plus its ``"timeline"`` summary."""
    import asyncio

    from gateway.backup.pgdump import DumpFormatError, dump, timeline_copy
    from runtime.storage.postgres.pool import check_dsn, redact_dsn
    try:
        check_dsn(dsn)
        part = asyncio.run(dump(dsn, tmp / "postgres"))
    except Exception as exc:  # noqa: BLE001 - asyncpg, OS and DSN errors alike
        raise BackupError(f"PostgreSQL at {redact_dsn(dsn)}: the snapshot failed: "
                          f"{type(exc).__name__}: {redact_dsn(str(exc))}") from None
    for t in part["tables"]:
        path = tmp / t["file"]
        t["size"], t["sha256"] = path.stat().st_size, _sha256(path)
    timeline = None
    try:
        if timeline_copy(part, tmp / "postgres", tmp / "timeline-check.db"):
            timeline = {"db": "postgres", "pending": None,
                        **timeline_summary(tmp / "timeline-check.db", None)}
    except (DumpFormatError, sqlite3.Error) as exc:
        raise BackupError(f"PostgreSQL timeline: cannot be read from the snapshot: {exc}") \
            from None
    return {**part, "timeline": timeline}


def _stage(items: list[Item], stage: Path, dest: Path, cut: Any) -> list[dict[str, Any]]:
    """Copy every item under ``stage`` (as of ``cut`` when there is one); their manifest
    entries (path order). A failed read names the file, a failed write ``dest``."""
    files = []
    read = cut.read if cut is not None else read_item
    for item in items:
        target = stage / item.rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if not read(item, target):
                continue
        except WriteFailed as exc:
            raise BackupError(f"{dest}: cannot be written: {exc.reason} (while copying "
                              f"{item.rel})") from None
        except (OSError, sqlite3.Error) as exc:
            raise BackupError(f"{item.rel}: cannot be read: {exc}") from None
        files.append({"path": item.rel, "kind": item.kind, "size": target.stat().st_size,
                      "sha256": _sha256(target)})
    files.sort(key=lambda f: f["path"])
    return files


def _write_tar(dest: Path, stage: Path, manifest: dict[str, Any], partial: Path,
               overwrite: bool, unique: bool = False) -> Path:
    """Write the archive to ``partial`` and move it into place; the final path."""
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
                tar.addfile(info, io.BytesIO(data))
                members = [(stage / e["path"], PREFIX + e["path"]) for e in manifest["files"]]
                members += [(stage.parent / t["file"], t["file"])
                            for t in manifest.get("postgres", {}).get("tables", [])]
                for src, arcname in members:
                    info = tar.gettarinfo(str(src), arcname=arcname)
                    info.mode, info.uid, info.gid, info.uname, info.gname = 0o600, 0, 0, "", ""
                    with open(src, "rb") as fh:
                        tar.addfile(info, fh)
            raw.flush()
            os.fsync(raw.fileno())
        return _move_into_place(partial, dest, overwrite, unique)
    except OSError as exc:
        raise BackupError(f"{dest}: cannot be written: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)


def _move_into_place(partial: Path, dest: Path, overwrite: bool,
                     unique: bool = False) -> Path:
    """``partial`` (same file system) becomes ``dest``; returns it. Without ``overwrite``
    a hard link, so a file that appeared at ``dest`` since the check is kept (BackupError;
    with ``unique`` the next numbered name is tried instead); a file system without hard
    links gets a check and a rename. With ``overwrite`` the check again (still a regular
    file) and a rename. Raises BackupError or OSError."""
    if overwrite:
        _check_existing(dest, True)
        os.replace(partial, dest)
        return dest
    for n in range(100 if unique else 1):
        where = numbered(dest, n)
        try:
            os.link(partial, where)
            return where
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if unique and where.exists():
                continue
            _check_existing(where, False)
            os.replace(partial, where)
            return where
    raise BackupError(f"{dest}: exists: not replaced (choose a new file name, or "
                      "--force to replace it)")


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("tidegate")
    except Exception:  # noqa: BLE001
        return "0.0.0"
