"""``tidegate backup verify`` and ``backup restore``: every hash, every database, every
timeline chain of an archive made by ``archive.py``.

:func:`verify_archive` unpacks into a temp dir, :func:`restore` into the (empty) target;
both stream the archive once, comparing each member with its manifest entry (size and
SHA-256), then :func:`check_tree` opens every SQLite database (``PRAGMA
integrity_check``) and verifies every timeline chain (database plus pending log, as the
gateway will read them) against the heads in the manifest. Problems are sentences naming
the file; the first one is what the CLI reports.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from gateway.backup.archive import FORMAT, MANIFEST, PREFIX, VERSION, timeline_summary


class RestoreRefused(RuntimeError):
    """The restore target is not an empty directory (nothing was written)."""


@dataclass(slots=True)
class Checked:
    """Outcome of a verify or restore: ``problems`` (first = the one to report; empty =
    ok), the ``manifest`` (None when unreadable), counts of ``files`` and ``databases``
    checked, and the timeline's ``sessions``/``events`` verified."""

    problems: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    files: int = 0
    databases: int = 0
    sessions: int = 0
    events: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def _safe_rel(name: str) -> str | None:
    """The state-dir path of archive member ``name``, or None when it is not a plain
    relative path under ``state/``."""
    if not name.startswith(PREFIX):
        return None
    rel = PurePosixPath(name[len(PREFIX):])
    if rel.is_absolute() or not rel.parts or ".." in rel.parts:
        return None
    return rel.as_posix()


def _read_manifest(tar: tarfile.TarFile, out: Checked) -> dict[str, Any] | None:
    first = tar.next()
    if first is None or first.name != MANIFEST or not first.isreg():
        out.problems.append(f"{MANIFEST} is not the first member: not a tidegate backup")
        return None
    try:
        manifest = json.loads(tar.extractfile(first).read())  # type: ignore[union-attr]
    except ValueError as exc:
        out.problems.append(f"{MANIFEST}: not valid JSON ({exc})")
        return None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        out.problems.append(f"{MANIFEST}: format {manifest.get('format')!r} version "
                            f"{manifest.get('version')!r}, expected {FORMAT!r} {VERSION}")
        return None
    return manifest


def _extract_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path,
                    want: dict[str, Any]) -> str | None:
    """Write ``member`` to ``target`` hashing it; the problem, or None."""
    h, size = hashlib.sha256(), 0
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    src = tar.extractfile(member)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        for chunk in iter(lambda: src.read(1 << 20), b""):  # type: ignore[union-attr]
            h.update(chunk)
            size += len(chunk)
            fh.write(chunk)
    if size != want["size"]:
        return f"{want['path']}: size {size} bytes, the manifest says {want['size']}"
    if h.hexdigest() != want["sha256"]:
        return (f"{want['path']}: SHA-256 {h.hexdigest()[:16]}… does not match the "
                f"manifest's {want['sha256'][:16]}…")
    return None


def unpack(archive: Path, dest: Path) -> Checked:
    """Stream ``archive`` into ``dest``, checking every member against the manifest."""
    out = Checked()
    try:
        with tarfile.open(archive, mode="r|gz") as tar:
            manifest = _read_manifest(tar, out)
            if manifest is None:
                return out
            out.manifest = manifest
            wanted = {f["path"]: f for f in manifest.get("files", [])}
            seen: set[str] = set()
            for member in tar:
                if member is tar.members[0]:  # the manifest (iteration starts over)
                    continue
                rel = _safe_rel(member.name)
                if rel is None or not member.isreg():
                    out.problems.append(f"{member.name}: unexpected member (not a file "
                                        f"under {PREFIX})")
                    continue
                if rel not in wanted or rel in seen:
                    out.problems.append(f"{rel}: not in the manifest" if rel not in wanted
                                        else f"{rel}: twice in the archive")
                    continue
                seen.add(rel)
                problem = _extract_member(tar, member, dest / rel, wanted[rel])
                out.files += 1
                if problem:
                    out.problems.append(problem)
            out.problems += [f"{rel}: in the manifest but missing from the archive"
                             for rel in wanted if rel not in seen]
    except FileNotFoundError:
        out.problems.append(f"{archive}: no such file")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        out.problems.append(f"{archive}: the archive is damaged ({exc})")
    return out


def check_tree(root: Path, out: Checked, *, rehash: bool = False) -> Checked:
    """Open every database of the manifest under ``root`` and verify the timeline;
    ``rehash``: also compare every file on disk with the manifest again."""
    manifest = out.manifest or {}
    for entry in manifest.get("files", []):
        path = root / entry["path"]
        if rehash and (not path.is_file() or _hash(path) != entry["sha256"]):
            out.problems.append(f"{entry['path']}: differs from the manifest after restore")
        if entry["kind"] == "sqlite":
            out.databases += 1
            problem = _integrity(path)
            if problem:
                out.problems.append(f"{entry['path']}: {problem}")
    tl = manifest.get("timeline")
    if tl and not out.problems:
        _check_timeline(root, tl, out)
    return out


def _hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _integrity(path: Path) -> str | None:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return f"cannot be opened as a database ({exc})"
    return None if rows == ["ok"] else f"database check failed ({'; '.join(rows[:3])})"


def _check_timeline(root: Path, tl: dict[str, Any], out: Checked) -> None:
    from runtime.timeline.pending import read_pending
    from runtime.timeline.verify import verify_rows
    db = root / tl["db"]
    pend_path = root / tl["pending"] if tl.get("pending") else None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        pend = read_pending(str(pend_path)) if pend_path else None
        report = verify_rows(conn, None, pend)
        got = timeline_summary(db, pend_path)
    except sqlite3.Error as exc:
        out.problems.append(f"{tl['db']}: cannot be read as a timeline ({exc})")
        return
    finally:
        conn.close()
    out.sessions, out.events = report.sessions_checked, report.events_checked
    if not report.ok:
        where = f" (session {report.session_id}, seq {report.seq})" if report.session_id else ""
        detail = f": {report.detail}" if report.detail else ""
        out.problems.append(f"{tl['db']}: timeline chain broken: {report.reason}{where}{detail}")
    elif got["heads"] != tl.get("heads"):
        bad = next((s for s in {*got["heads"], *tl.get("heads", {})}
                    if got["heads"].get(s) != tl.get("heads", {}).get(s)), "?")
        out.problems.append(f"{tl['db']}: timeline heads differ from the manifest "
                            f"(session {bad})")


def verify_archive(archive: Path) -> Checked:
    """Every hash, every database, every timeline chain of ``archive`` (unpacked into a
    temp dir that is removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="tidegate-verify-") as tmp:
        out = unpack(archive, Path(tmp))
        if out.ok:
            check_tree(Path(tmp), out)
        return out


def restore(archive: Path, target: Path) -> Checked:
    """Unpack ``archive`` into ``target`` (missing or an empty directory, else
    RestoreRefused), then verify what landed on disk. On a problem the target is
    emptied again (it was empty before) and the problems are returned."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise RestoreRefused(f"{target} is not an empty directory: restore only into an "
                             "empty (or new) state dir")
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(target, 0o700)
    out = unpack(archive, target)
    if out.ok:
        check_tree(target, out, rehash=True)
    if not out.ok:
        for child in target.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    return out
