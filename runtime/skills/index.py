"""Timestamps of workspace skills: ``<workspace>/skills/<dir>/SKILL.md`` (seed 002 "every
record carries UTC timestamps"; DESIGN.md "Time"). Bookkeeping only: what the prompt
offers comes from ``runtime.skills.sources`` / ``runtime.skills.catalog``.

A skill is a directory with a ``SKILL.md`` whose YAML-ish frontmatter gives ``name`` and
``description``. The index ``<workspace>/skills/.index.json`` keeps, per skill directory::

    {"version": 1, "skills": {"<dir>": {"name", "description", "created_at", "updated_at",
     "last_used_at", "mtime_ns", "size"}}}

with times as RFC 3339 UTC strings (``last_used_at`` null until the agent first reads the
skill). ``created_at`` is when the skill was first seen (its file's mtime at that moment),
``updated_at`` the mtime of the last content change, ``last_used_at`` the last time the agent
read its SKILL.md with the ``read`` tool. The index is rewritten atomically (temp file +
fsync + rename) and only when something changed. An index that is missing, unreadable or
from an older version (entries without times) loads with the missing times filled from the
files; it never stops the agent.

``last_used_at`` is bookkeeping, not prompt material: the prompt's skills index
(:func:`render_index`) lists name, description and path only, so the stable prompt prefix
stays byte-identical when a skill is used.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from runtime.clock import parse_iso, utc_iso
from runtime.skills.frontmatter import SkillFormatError, parse_front_matter

log = structlog.get_logger(__name__)

INDEX_NAME = ".index.json"
INDEX_VERSION = 1
_HEAD_BYTES = 4000  # frontmatter lives at the top; never read whole large skill files

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill. Times are epoch seconds (UTC); ``last_used_at`` None = never read.

    ``dir`` is the directory name under ``skills/``; ``path`` is ``skills/<dir>/SKILL.md``
    (relative to the workspace, the path the agent passes to ``read``).
    """

    dir: str
    name: str
    description: str
    path: str
    created_at: float
    updated_at: float
    last_used_at: float | None = None


def frontmatter(text: str) -> dict[str, str]:
    """``name``/``description`` of a SKILL.md head, leniently ({} when malformed: the
    catalog reports malformed skills; bookkeeping just keeps the directory name)."""
    try:
        meta, _ = parse_front_matter(text)
    except SkillFormatError:
        return {}
    return {k: str(meta[k]) for k in ("name", "description") if meta.get(k) is not None}


def _lock(workspace: Path) -> threading.Lock:
    key = str(workspace)
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def _time(value: Any) -> float | None:
    """Epoch seconds from an index value (RFC 3339 string or number); None when absent/bad."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) / (1000.0 if value > 1e11 else 1.0)
    if isinstance(value, str) and value:
        try:
            return parse_iso(value)
        except ValueError:
            return None
    return None


def _read_index(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("skills_index_unreadable", path=str(path), error=str(exc))
        return {}
    skills = data.get("skills") if isinstance(data, dict) else None
    if not isinstance(skills, dict):
        return {}
    return {k: v for k, v in skills.items() if isinstance(k, str) and isinstance(v, dict)}


def _write_index(workspace: Path, skills: dict[str, dict[str, Any]]) -> None:
    """Replace ``skills/.index.json`` through the workspace fd walk (a command in the
    workspace cannot swap ``skills/`` for a link out). Raises OSError."""
    from runtime.tools import workspace_fs
    from runtime.tools.registry import ToolError
    payload = json.dumps({"version": INDEX_VERSION, "skills": skills}, ensure_ascii=False,
                         indent=1, sort_keys=True).encode("utf-8")
    try:
        workspace_fs.write_bytes(workspace, f"skills/{INDEX_NAME}", payload, mode=0o644)
    except ToolError as exc:
        raise OSError(str(exc)) from None


def _skill_of(dir_name: str, rec: dict[str, Any]) -> Skill:
    return Skill(dir=dir_name, name=rec["name"], description=rec["description"],
                 path=f"skills/{dir_name}/SKILL.md", created_at=_time(rec["created_at"]) or 0.0,
                 updated_at=_time(rec["updated_at"]) or 0.0,
                 last_used_at=_time(rec.get("last_used_at")))


def _sync(workspace: Path, now: float) -> tuple[dict[str, dict[str, Any]], bool]:
    """Scan the skills and merge them into the stored index; (records, changed)."""
    root = workspace / "skills"
    stored = _read_index(root / INDEX_NAME)
    records: dict[str, dict[str, Any]] = {}
    changed = False
    for md in sorted(root.glob("*/SKILL.md")):
        name = md.parent.name
        try:
            st = md.stat()
        except OSError:
            continue
        old = stored.get(name, {})
        rec = dict(old)
        same = (old.get("mtime_ns"), old.get("size")) == (st.st_mtime_ns, st.st_size)
        if not same or "name" not in old or "description" not in old:
            try:
                with open(md, encoding="utf-8", errors="replace") as fh:
                    meta = frontmatter(fh.read(_HEAD_BYTES))
            except OSError as exc:
                log.warning("skill_unreadable", path=str(md), error=str(exc))
                continue
            rec["name"] = meta.get("name") or name
            rec["description"] = meta.get("description", "")
            rec["mtime_ns"], rec["size"] = st.st_mtime_ns, st.st_size
        mtime = min(st.st_mtime, now)  # a file stamped in the future is not "newer than now"
        if not same and old.get("mtime_ns") is not None:  # content changed since last look
            rec["updated_at"] = utc_iso(mtime)
        # Fill what an older index (or a new skill) lacks; never crash on bad values.
        created = _time(rec.get("created_at"))
        updated = _time(rec.get("updated_at"))
        if created is None:
            created = min(updated, mtime) if updated is not None else mtime
            rec["created_at"] = utc_iso(created)
        if updated is None:
            rec["updated_at"] = utc_iso(max(created, mtime))
        if "last_used_at" in rec and rec["last_used_at"] is not None \
                and _time(rec["last_used_at"]) is None:
            rec["last_used_at"] = None
        rec.setdefault("last_used_at", None)
        records[name] = rec
        changed = changed or rec != old
    changed = changed or records.keys() != stored.keys()
    return records, changed


def load_skills(workspace: str | Path, *, now: float, persist: bool = True) -> list[Skill]:
    """The workspace's skills sorted by directory name, with their timestamps.

    ``now`` is epoch seconds (caps file mtimes from the future). Updates
    ``skills/.index.json`` when a skill was added, changed or removed, or old entries lacked
    times (``persist=False`` only reads). Blocking file I/O: call it off the event loop
    where latency matters. Never raises for a bad index or an unreadable skill (logged and
    skipped); OSError only when the index cannot be written.
    """
    workspace = Path(workspace)
    root = workspace / "skills"
    if not root.is_dir():
        return []
    with _lock(workspace):
        records, changed = _sync(workspace, now)
        if changed and persist:
            _write_index(workspace, records)
            log.debug("skills_index_written", workspace=str(workspace), skills=len(records))
    return [_skill_of(d, r) for d, r in sorted(records.items())]


def mark_used(workspace: str | Path, dir_name: str, *, now: float) -> Skill | None:
    """Set ``last_used_at`` = ``now`` (epoch seconds) for skill ``dir_name`` and persist.

    Returns the updated skill, or None when there is no such skill. Raises OSError when the
    index cannot be written.
    """
    workspace = Path(workspace)
    with _lock(workspace):
        records, _ = _sync(workspace, now)
        rec = records.get(dir_name)
        if rec is None:
            return None
        rec["last_used_at"] = utc_iso(now)
        _write_index(workspace, records)
    log.info("skill_used", workspace=str(workspace), skill=dir_name)
    return _skill_of(dir_name, rec)


def skill_dir_of(workspace: Path, resolved: Path) -> str | None:
    """The skill directory name when ``resolved`` (an absolute, resolved path) is
    ``<workspace>/skills/<dir>/SKILL.md``; else None."""
    root = workspace.resolve() / "skills"
    if resolved.name != "SKILL.md" or resolved.parent.parent != root:
        return None
    return resolved.parent.name


def render_index(skills: list[Skill]) -> str:
    """The prompt's skills list, one ``- name: description (skills/<dir>/SKILL.md)`` line
    per skill. Deliberately without times, so using a skill never changes the prompt."""
    return "\n".join(f"- {s.name}: {s.description} ({s.path})" for s in skills)
