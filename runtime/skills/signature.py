"""The skills file signature, cached by directory stat (issue 11: the per-turn check must
cost ≤ 5 ms with 150+ skills; bench/tools_bench.py measures it).

The signature is ``((SKILL.md path, mtime_ns, size), ...)`` over every source, exactly
what :func:`runtime.skills.sources.signature` returns. Listing a source directory is the
expensive part, so the list of its subdirectories is kept and re-read only when the
source directory's own stat (mtime, inode) changes — adding, removing or renaming a skill
directory changes it. Each candidate ``<dir>/SKILL.md`` is still stat'ed on every check
(one ``os.stat`` on a str path, no Path objects), so an edit in place, an atomic replace
or a SKILL.md appearing in an existing directory is seen at once.

Racy listings (as in git's index): a listing taken within ``RACY_SECONDS`` of the
directory's mtime is not trusted, because a change in the same filesystem timestamp tick
would not move the mtime; such a directory is listed again at the next check.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

RACY_SECONDS = 2.0


@dataclass(slots=True)
class _Listing:
    key: tuple[int, int, int]  # (st_mtime_ns, st_ino, st_dev) of the source directory
    listed_at_ns: int
    candidates: list[str]  # "<dir>/SKILL.md" for every subdirectory, sorted


def list_candidates(root: str) -> list[str]:
    """``<root>/<subdir>/SKILL.md`` for every subdirectory of ``root`` (whether or not the
    file exists), sorted; [] when ``root`` cannot be listed."""
    out = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        try:
            if entry.is_dir():
                out.append(os.path.join(entry.path, "SKILL.md"))
        except OSError:
            continue
    out.sort()
    return out


class SignatureCache:
    """Signature of ``dirs`` (``(source, dir)`` pairs), listing each dir only when it
    changed. Not thread-safe on its own (the catalog holds its lock around it)."""

    def __init__(self, dirs: list[tuple[str, Path]]) -> None:
        self.roots = [str(d) for _, d in dirs]
        self._listings: dict[str, _Listing] = {}
        self.listings = 0  # directory listings done (tests, bench)

    def _candidates(self, root: str) -> list[str]:
        try:
            st = os.stat(root)
        except OSError:
            self._listings.pop(root, None)
            return []
        key = (st.st_mtime_ns, st.st_ino, st.st_dev)
        cached = self._listings.get(root)
        if cached is not None and cached.key == key and \
                cached.listed_at_ns - st.st_mtime_ns > RACY_SECONDS * 1e9:
            return cached.candidates
        now = time.time_ns()
        candidates = list_candidates(root)
        self.listings += 1
        self._listings[root] = _Listing(key, now, candidates)
        return candidates

    def signature(self) -> tuple:
        out = []
        for root in self.roots:
            for path in self._candidates(root):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.append((path, st.st_mtime_ns, st.st_size))
        return tuple(out)
