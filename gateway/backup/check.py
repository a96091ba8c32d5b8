"""``tidegate backup verify`` and ``backup restore``: every hash, every database, every
timeline chain of an archive made by ``archive.py``.

:func:`verify_archive` unpacks into a temp dir, :func:`restore` into the (empty) target;
both stream the archive once, comparing each member with its manifest entry (size and
SHA-256), then :func:`check_tree` opens every SQLite database (``PRAGMA
integrity_check``) and verifies every timeline chain (database plus pending log, as the
gateway will read them) against the heads in the manifest, then checks that sessions.db,
the transcripts and the timeline agree where the formats allow it (``consistency.py``).
Problems are sentences naming the file; the first one is what the CLI reports.
"""

from __future__ import annotations

import gzip
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
from gateway.backup.extract import TargetUnwritable, below, extract_member


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
    notes: list[str] = field(default_factory=list)  # what a restore changed, for people

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


def _restore_modes(target: Path, manifest: dict[str, Any]) -> None:
    """Give the restored directories the permission bits they had (manifest ``dirs``)."""
    dirs = manifest.get("dirs")
    for rel, mode in (dirs.items() if isinstance(dirs, dict) else ()):
        safe = _safe_rel(PREFIX + str(rel))
        path = target / safe if safe else None
        if path is not None and path.is_dir() and not path.is_symlink() \
                and isinstance(mode, int):
            os.chmod(path, mode & 0o777)


def unpack(archive: Path, dest: Path, db_dest: Path | None = None) -> Checked:
    """Stream ``archive`` into ``dest``, checking every member against the manifest; the
    PostgreSQL COPY files (``postgres/<table>.copy``) go to ``db_dest`` (default
    ``dest``'s sibling ``<dest>.postgres``)."""
    out = Checked()
    db_dest = dest.parent / (dest.name + ".postgres") if db_dest is None else db_dest
    try:
        # gzip.GzipFile checks the trailer (CRC-32 and length) that tarfile's own "r|gz"
        # stream never reads: the stream is drained to its end after the last member
        with gzip.open(archive, "rb") as gz, tarfile.open(fileobj=gz, mode="r|") as tar:
            manifest = _read_manifest(tar, out)
            if manifest is None:
                return out
            out.manifest = manifest
            wanted = {f["path"]: f for f in manifest.get("files", [])}
            copies = {t["file"]: {**t, "path": t["file"]}
                      for t in (manifest.get("postgres") or {}).get("tables", [])}
            seen: set[str] = set()
            seen_copies: set[str] = set()
            for member in tar:
                if member is tar.members[0]:  # the manifest (iteration starts over)
                    continue
                if member.name in copies and member.isreg() and member.name not in seen_copies:
                    seen_copies.add(member.name)
                    out.files += 1
                    if problem := extract_member(tar, member, db_dest / PurePosixPath(
                            member.name).name, copies[member.name]):
                        out.problems.append(problem)
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
                problem = extract_member(tar, member, dest / rel, wanted[rel])
                out.files += 1
                if problem:
                    out.problems.append(problem)
            out.problems += [f"{rel}: in the manifest but missing from the archive"
                             for rel in wanted if rel not in seen]
            out.problems += [f"{name}: in the manifest but missing from the archive"
                             for name in copies if name not in seen_copies]
            while gz.read(1 << 20):  # to EOF: a bad CRC, length or a cut tail raises
                pass
    except TargetUnwritable as exc:
        out.problems.append(f"{dest}: cannot be written: {exc.reason} (while writing "
                            f"{below(exc.path, dest)}); the archive was not at fault")
    except FileNotFoundError:
        out.problems.append(f"{archive}: no such file")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        out.problems.append(f"{archive}: the archive is damaged ({exc})")
    return out


def check_tree(root: Path, out: Checked, *, rehash: bool = False,
               db_root: Path | None = None) -> Checked:
    """Open every database of the manifest under ``root`` and verify the timeline;
    ``rehash``: also compare every file on disk with the manifest again. ``db_root``: where
    :func:`unpack` put the PostgreSQL COPY files (default ``<root>.postgres``): each is
    decoded and its rows counted, and the database's timeline chains are verified."""
    manifest = out.manifest or {}
    if manifest.get("postgres"):
        db_root = root.parent / (root.name + ".postgres") if db_root is None else db_root
        return _check_postgres(root, db_root, out, rehash=rehash)
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
    if not out.problems and not manifest.get("postgres"):
        from gateway.backup.consistency import check_consistency
        check_consistency(root, manifest, out.problems)
    return out


def _check_postgres(root: Path, db_root: Path, out: Checked, *, rehash: bool) -> Checked:
    """The local files as for embedded storage, every COPY file decoded with the row count
    the manifest says, then the timeline rebuilt from the dump and verified."""
    from gateway.backup.pgdump import DumpFormatError, read_copy, timeline_copy
    manifest = out.manifest or {}
    part = manifest["postgres"]
    check_tree(root, Checked(out.problems, {**manifest, "postgres": None, "timeline": None}),
               rehash=rehash)
    for t in part.get("tables", []):
        out.databases += 1
        try:
            rows = sum(1 for _ in read_copy(db_root / PurePosixPath(t["file"]).name))
        except (DumpFormatError, OSError) as exc:
            out.problems.append(f"{t['file']}: {exc}")
            continue
        if rows != t["rows"]:
            out.problems.append(f"{t['file']}: {rows} rows, the manifest says {t['rows']}")
    tl = manifest.get("timeline")
    if tl and not out.problems:
        with tempfile.TemporaryDirectory(prefix="tidegate-verify-tl-") as tmp:
            try:
                timeline_copy(part, db_root, Path(tmp) / "timeline.db")
            except (DumpFormatError, sqlite3.Error) as exc:
                out.problems.append(f"postgres timeline: cannot be rebuilt ({exc})")
                return out
            _check_timeline(Path(tmp), {**tl, "db": "timeline.db", "pending": None}, out)
            out.problems[:] = [p.replace("timeline.db:", "postgres timeline:", 1)
                               for p in out.problems]
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
        state, db = Path(tmp) / "state", Path(tmp) / "postgres"
        out = unpack(archive, state, db)
        if out.ok:
            check_tree(state, out, db_root=db)
        return out


def peek_manifest(archive: Path) -> dict[str, Any] | None:
    """The archive's manifest (its first member) without reading the rest; None when it
    cannot be read (``unpack`` then names the problem)."""
    out = Checked()
    try:
        with tarfile.open(archive, mode="r|gz") as tar:
            return _read_manifest(tar, out)
    except (tarfile.TarError, EOFError, zlib.error, OSError):
        return None


def restore(archive: Path, target: Path, dsn: str | None = None) -> Checked:
    """Unpack ``archive`` into ``target`` (missing or an empty directory, else
    RestoreRefused), then verify what landed on disk. A backup of PostgreSQL storage is
    loaded into the database at ``dsn`` (RestoreRefused when it is missing or the
    database is not empty; checked before anything is written). On a problem the target
    is emptied again (it was empty before) and the problems are returned. A target
    that cannot be listed, made or set to 0700 is the one problem returned then."""
    try:
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise RestoreRefused(f"{target} is not an empty directory: restore only into "
                                 "an empty (or new) state dir")
    except OSError as exc:
        return _unusable(target, exc, "cannot be read")
    manifest = peek_manifest(archive) or {}
    if manifest.get("postgres"):
        _check_database(dsn, manifest["postgres"])
    try:
        target.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(target, 0o700)  # the state dir is private (it holds transcripts)
    except OSError as exc:
        return _unusable(target, exc, "cannot be made private (mode 0700)"
                         if target.is_dir() else "cannot be created")
    with tempfile.TemporaryDirectory(prefix="tidegate-restore-") as tmp:
        out = unpack(archive, target, Path(tmp))
        if out.ok:
            check_tree(target, out, rehash=True, db_root=Path(tmp))
        if out.ok:
            _restore_modes(target, out.manifest or {})
            out.notes += drop_foreign_lkg(target)
        if out.ok and (out.manifest or {}).get("postgres") and dsn:
            _load_database(dsn, out, Path(tmp))
    if not out.ok:
        for child in target.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    return out


def _unusable(target: Path, exc: OSError, what: str) -> Checked:
    """The outcome of a restore whose target cannot be used (nothing was written)."""
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(target) else ""
    problem = (f"{target}: {what}: {exc.strerror or exc}{where}; restore into an empty "
               "directory that this user owns, or a new one")
    return Checked(problems=[problem])


def drop_foreign_lkg(target: Path) -> list[str]:
    """Delete the restored ``config.lkg.yaml`` unless the state dir it names (as a start
    on it would resolve it) is ``target``: started on it (``config.on_invalid: lkg``), a
    restored gateway would otherwise run on the original state dir. Returns the note."""
    from gateway.config.lkg import lkg_path
    from gateway.config.load import ConfigError, load_gateway_section
    lkg = lkg_path(target)
    if not lkg.is_file():
        return []
    try:
        named = load_gateway_section(str(lkg), quick=False).state_dir
        if named.resolve() == target.resolve():
            return []
        why = f"it names the state dir {named}"
    except (ConfigError, OSError, ValueError) as exc:
        why = f"its state dir cannot be read: {exc}"
    lkg.unlink()
    return [(f"{lkg.name} left out ({why}); a new last-known-good copy is kept once the "
            "restored gateway has served config.lkg_after")]


def _check_database(dsn: str | None, part: dict[str, Any]) -> None:
    """RestoreRefused unless this build ships every migration of the dump (``part``) and
    ``dsn`` names a reachable database with an empty schema."""
    import asyncio

    import asyncpg

    from gateway.backup.pgdump import occupied
    from runtime.storage.postgres.pool import check_dsn, redact_dsn
    if not dsn:
        raise RestoreRefused("this backup is of PostgreSQL storage: name the empty database "
                             "to load it into (--dsn postgresql://..., or storage.dsn)")
    from gateway.backup.pgdump import LoadRefused, check_migrations
    try:
        check_migrations(part)
    except LoadRefused as exc:
        raise RestoreRefused(str(exc)) from None

    async def taken() -> list[str]:
        conn = await asyncpg.connect(dsn)
        try:
            return await occupied(conn)
        finally:
            await conn.close()
    try:
        check_dsn(dsn)
        names = asyncio.run(taken())
    except Exception as exc:  # noqa: BLE001 - asyncpg, OS and DSN errors alike
        raise RestoreRefused(f"PostgreSQL at {redact_dsn(dsn)} cannot be reached: "
                             f"{type(exc).__name__}: {redact_dsn(str(exc))}") from None
    if names:
        raise RestoreRefused(f"the database at {redact_dsn(dsn)} is not empty (it has "
                             f"{', '.join(names)}): restore only into an empty database")


def _load_database(dsn: str, out: Checked, copies: Path) -> None:
    import asyncio

    from gateway.backup.pgdump import LoadRefused, load
    from runtime.storage.postgres.pool import redact_dsn
    try:
        asyncio.run(load(dsn, (out.manifest or {})["postgres"], copies))
    except LoadRefused as exc:
        out.problems.append(f"restore refused: {exc}")
    except Exception as exc:  # noqa: BLE001 - asyncpg errors, a count that differs
        out.problems.append(f"PostgreSQL at {redact_dsn(dsn)}: loading failed: "
                            f"{type(exc).__name__}: {redact_dsn(str(exc))}")
