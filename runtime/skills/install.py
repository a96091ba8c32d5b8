"""``tidegate skills install PATH`` (seed 001 §7 "managed" source): copy skills into
``<state_dir>/skills``.

``PATH`` is a skill directory (with ``SKILL.md``), a directory of skill directories, or a
``.zip`` / ``.tar`` / ``.tar.gz`` / ``.tgz`` archive of either. Archives are unpacked with
the standard library's safe modes (tar ``filter="data"``; zip members outside the target
are refused). Each skill is validated (front matter, size) before anything is replaced;
an installed skill replaces the managed skill of the same name atomically (copied next
to it, then renamed).
"""

from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

from runtime.skills.frontmatter import SkillFormatError
from runtime.skills.sources import read_skill, skill_files

_SAFE = re.compile(r"[^a-z0-9._-]+")


class InstallError(ValueError):
    """Nothing was installed; the message says why."""


def _unpack(archive: Path, into: Path) -> Path:
    name = archive.name.lower()
    if name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                target = (into / member).resolve()
                if into.resolve() not in target.parents and target != into.resolve():
                    raise InstallError(f"archive member {member!r} leaves the target")
            zf.extractall(into)
    elif name.endswith((".tar", ".tar.gz", ".tgz")):
        with tarfile.open(archive) as tf:
            try:
                tf.extractall(into, filter="data")
            except tarfile.FilterError as exc:
                raise InstallError(f"unsafe archive member: {exc}") from None
    else:
        raise InstallError("not a skill directory or a .zip/.tar/.tar.gz/.tgz archive")
    entries = [p for p in into.iterdir() if not p.name.startswith(".")]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() and not \
        (into / "SKILL.md").exists() else into


def _skill_dirs(root: Path) -> list[Path]:
    if (root / "SKILL.md").is_file():
        return [root]
    dirs = [p.parent for p in skill_files(root)]
    if not dirs:
        raise InstallError(f"no SKILL.md in {root} or its subdirectories")
    return dirs


def _copy_in(src: Path, managed: Path, name: str) -> Path:
    dest = managed / (_SAFE.sub("-", name.lower()).strip("-.") or "skill")
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=managed))
    try:
        shutil.copytree(src, staging, dirs_exist_ok=True, symlinks=False)
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            dest.rename(old)
            staging.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def install(path: Path, managed: Path, max_bytes: int) -> list[tuple[str, Path]]:
    """Install the skills at ``path`` into ``managed``; returns ``(name, dir)`` pairs.
    Raises InstallError (nothing changed) for a missing path, a bad archive or any
    invalid SKILL.md."""
    if not path.exists():
        raise InstallError(f"{path}: no such file or directory")
    managed.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = path if path.is_dir() else _unpack(path, Path(tmp))
        found = []
        for d in _skill_dirs(root):
            try:
                found.append((read_skill(d / "SKILL.md", "managed", max_bytes).name, d))
            except (SkillFormatError, OSError, UnicodeDecodeError) as exc:
                raise InstallError(f"{d / 'SKILL.md'}: {exc}") from None
        return [(name, _copy_in(d, managed, name)) for name, d in found]
