"""``tidegate skills install PATH|GIT-URL[#REF]`` (seed 001 §7 "managed" source): copy
skills into ``<state_dir>/skills``.

``PATH`` is a skill directory (with ``SKILL.md``), a directory of skill directories (or of
``skills/``), or a ``.zip`` / ``.tar`` / ``.tar.gz`` / ``.tgz`` archive of either. A git
repository is given by URL (``https://``, ``ssh://``, ``git://``, ``file://``,
``git@host:path``, a ``git+<url>`` prefix, or a local path to a bare repository) with an
optional ``#REF`` (branch or tag); it is cloned shallowly with the real ``git``
(``runtime/skills/git_source.py``) and its tree is then treated like a directory.
Archives are unpacked with the standard library's safe modes (tar ``filter="data"``; zip
members outside the target are refused). Whatever the source, a symlink that leaves it
is refused (copying would pull in the target, e.g. a key file). Each skill is validated
(front matter, size) before anything is replaced; an installed skill replaces the
managed skill of the same name atomically (copied next to it, then renamed).
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

from runtime.skills.frontmatter import SkillFormatError
from runtime.skills.git_source import GitSourceError, clone, is_git_source
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
    """``root`` itself, its ``*/SKILL.md`` directories, or else those of ``root/skills``
    (the layout of published skill repositories)."""
    if (root / "SKILL.md").is_file():
        return [root]
    dirs = [p.parent for p in skill_files(root)] or \
        [p.parent for p in skill_files(root / "skills")]
    if not dirs:
        raise InstallError(f"no SKILL.md in {root} or its subdirectories")
    return dirs


def _check_links(root: Path) -> None:
    """Refuse symlinks that leave ``root`` (copying would pull in the target's bytes,
    e.g. a key file, as tar's "data" filter refuses for archives)."""
    top = root.resolve()
    for path in root.rglob("*"):
        if path.is_symlink():
            target = path.resolve()
            if top != target and top not in target.parents:
                raise InstallError(f"{path.relative_to(root)}: symlink leaves the source "
                                   f"(-> {os.readlink(path)})")


def _copy_in(src: Path, managed: Path, name: str) -> Path:
    dest = managed / (_SAFE.sub("-", name.lower()).strip("-.") or "skill")
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=managed))
    try:
        shutil.copytree(src, staging, dirs_exist_ok=True, symlinks=False,
                        ignore=shutil.ignore_patterns(".git"))
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


def install(source: str | Path, managed: Path, max_bytes: int, *,
            git_timeout: float = 120.0) -> list[tuple[str, Path]]:
    """Install the skills at ``source`` (a path, or a git URL — see the module docstring)
    into ``managed``; returns ``(name, dir)`` pairs. Raises InstallError (nothing
    changed) for a missing path, a bad archive, a failed clone, a symlink leaving the
    source or any invalid SKILL.md."""
    spec = str(source)
    path = Path(spec).expanduser()
    git = is_git_source(spec)
    if not git and not path.exists():
        raise InstallError(f"{path}: no such file or directory")
    managed.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if git:
            try:
                root = clone(spec, Path(tmp) / "repo", timeout=git_timeout)
            except GitSourceError as exc:
                raise InstallError(str(exc)) from None
        else:
            root = path if path.is_dir() else _unpack(path, Path(tmp))
        _check_links(root)
        found = []
        for d in _skill_dirs(root):
            try:
                found.append((read_skill(d / "SKILL.md", "managed", max_bytes).name, d))
            except (SkillFormatError, OSError, UnicodeDecodeError) as exc:
                raise InstallError(f"{d / 'SKILL.md'}: {exc}") from None
        return [(name, _copy_in(d, managed, name)) for name, d in found]
