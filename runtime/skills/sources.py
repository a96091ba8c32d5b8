"""Skill sources and precedence (seed 001 §7).

Six sources, lowest precedence first; a skill of a higher source replaces a same-named
skill of a lower one:

1. ``extra`` — ``skills.extra_dirs`` (config)
2. ``bundled`` — shipped in the tidegate package (``runtime/skills/bundled``)
3. ``managed`` — ``<state_dir>/skills`` (``tidegate skills install``)
4. ``personal`` — ``~/.agents/skills`` (``skills.personal_dir``)
5. ``project`` — ``<workspace>/.agents/skills``
6. ``workspace`` — ``<workspace>/skills``

A skill is a directory with a ``SKILL.md`` directly under a source directory. Inside one
source, two skills with the same name: the first by path wins, the other is reported. A
malformed, oversized (> ``max_file_bytes``) or unreadable SKILL.md is skipped with one
diagnostic. A skill whose ``requires`` are not met is kept in the scan (``missing`` says
why) but not offered to the model.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from runtime.skills.frontmatter import SkillFormatError, parse_front_matter, requirements
from runtime.skills.signature import list_candidates

log = structlog.get_logger(__name__)

SOURCES = ("extra", "bundled", "managed", "personal", "project", "workspace")
BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
_OS_NAMES = {"linux": "linux", "darwin": "darwin", "macos": "darwin", "mac": "darwin",
             "win32": "win32", "windows": "win32"}


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill as found. ``path`` is the SKILL.md; ``body`` the text after the front
    matter; ``missing`` lists unmet requirements (``bin:ffmpeg``, ``env:API_KEY``,
    ``os:darwin``) — empty when the skill is offered."""

    name: str
    description: str
    source: str
    path: Path
    always: bool = False
    requires: dict[str, list[str]] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    body: str = ""
    size: int = 0

    @property
    def available(self) -> bool:
        return not self.missing

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "source": self.source,
                "path": str(self.path), "always": self.always, "requires": self.requires,
                "available": self.available, "missing": list(self.missing),
                "size": self.size}


@dataclass(slots=True)
class SkillScan:
    """Result of scanning every source: the effective ``skills`` (by name, highest
    source wins), ``overridden`` ``(name, lost_source, won_source)``, ``diagnostics``
    (one line per skipped file or duplicate) and the file ``signature``."""

    skills: dict[str, Skill]
    overridden: list[tuple[str, str, str]]
    diagnostics: list[str]
    signature: tuple


def source_dirs(*, extra: list[Path], managed: Path | None, personal: Path | None,
                workspace: Path | None, bundled: bool = True) -> list[tuple[str, Path]]:
    """``(source, dir)`` pairs in precedence order (lowest first)."""
    out = [("extra", d) for d in extra]
    if bundled:
        out.append(("bundled", BUNDLED_DIR))
    if managed is not None:
        out.append(("managed", managed))
    if personal is not None:
        out.append(("personal", personal))
    if workspace is not None:
        out += [("project", workspace / ".agents" / "skills"),
                ("workspace", workspace / "skills")]
    return out


def _skill_stats(root: Path) -> list[tuple[Path, os.stat_result]]:
    """``(<root>/<dir>/SKILL.md, its stat)`` sorted by path: one scandir plus one stat per
    skill."""
    out = []
    for candidate in list_candidates(str(root)):
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((Path(candidate), st))
    return sorted(out, key=lambda ps: ps[0])


def skill_files(root: Path) -> list[Path]:
    """``<root>/*/SKILL.md`` sorted by path ([] when ``root`` is not a directory)."""
    return [p for p, _ in _skill_stats(root)]


def missing_requirements(req: dict[str, list[str]]) -> tuple[str, ...]:
    """Unmet ``requires`` entries on this machine and environment."""
    out = [f"bin:{b}" for b in req.get("bins", []) if shutil.which(b) is None]
    out += [f"env:{e}" for e in req.get("env", []) if not os.environ.get(e)]
    wanted = {_OS_NAMES.get(o.lower(), o.lower()) for o in req.get("os", [])}
    if wanted and sys.platform not in wanted:
        out.append("os:" + "|".join(sorted(wanted)))
    return tuple(out)


def read_skill(path: Path, source: str, max_bytes: int) -> Skill:
    """Parse one SKILL.md. Raises SkillFormatError (malformed, too large) or OSError."""
    size = path.stat().st_size
    if size > max_bytes:
        raise SkillFormatError(f"file is {size} bytes, over the {max_bytes}-byte limit")
    text = path.read_text(encoding="utf-8")
    meta, body = parse_front_matter(text)
    req = requirements(meta)
    return Skill(name=meta["name"].strip(), description=" ".join(
        str(meta.get("description") or "").split()), source=source, path=path,
        always=meta.get("always") is True, requires=req, missing=missing_requirements(req),
        body=body.strip(), size=size)


def signature(dirs: list[tuple[str, Path]]) -> tuple:
    """(path, mtime_ns, size) of every SKILL.md of every source: changes when a skill
    file is added, removed or edited."""
    return tuple((str(p), st.st_mtime_ns, st.st_size) for _, d in dirs
                 for p, st in _skill_stats(d))


def scan(dirs: list[tuple[str, Path]], max_bytes: int) -> SkillScan:
    """Scan the sources (see module docstring). Never raises."""
    found: dict[str, Skill] = {}
    overridden: list[tuple[str, str, str]] = []
    problems: list[str] = []
    sig = []
    for source, root in dirs:
        seen: dict[str, Path] = {}
        if source == "extra" and not root.is_dir():  # a typo would hide every skill in it
            sig.append((str(root), -1, -1))
            problems.append(f"extra: {root}: the skills.extra_dirs directory does not "
                            "exist" if not root.exists() else
                            f"extra: {root}: skills.extra_dirs entry is not a directory")
            continue
        for path, st in _skill_stats(root):
            sig.append((str(path), st.st_mtime_ns, st.st_size))
            try:
                skill = read_skill(path, source, max_bytes)
            except (SkillFormatError, OSError, UnicodeDecodeError) as exc:
                problems.append(f"{source}: {path}: skipped: {exc}")
                continue
            if skill.name in seen:
                problems.append(f"{source}: {path}: skipped: duplicate skill name "
                                f"{skill.name!r} (first: {seen[skill.name]})")
                continue
            seen[skill.name] = path
            if skill.name in found:
                overridden.append((skill.name, found[skill.name].source, source))
            found[skill.name] = skill
    for line in problems:
        log.warning("skill_skipped", problem=line)
    return SkillScan(dict(sorted(found.items())), overridden, problems, tuple(sig))
