"""One agent's skills: the six sources scanned, cached, and rendered for the prompt
(seed 001 §7; DESIGN.md "Performance": rebuilt only when a skill file changes).

:meth:`SkillCatalog.signature` stats the SKILL.md files of every source (mtime, size;
source directories are listed again only when their own stat changed,
``runtime/skills/signature.py``); :meth:`SkillCatalog.scan` re-reads them only when it
changed. The prompt builder folds
the signature into its own, so the stable prompt prefix stays byte-identical until a
skill file changes.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog

from runtime.skills.budget import BudgetResult, build_section
from runtime.skills.config import MAX_FILE_BYTES, MAX_PROMPT_CHARS, MAX_SKILLS
from runtime.skills.index import load_skills
from runtime.skills.signature import SignatureCache
from runtime.skills.sources import SkillScan, scan, source_dirs

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SkillLimits:
    """Budget: skills in the prompt, characters of skills text, bytes per SKILL.md."""

    max_skills: int = MAX_SKILLS
    max_chars: int = MAX_PROMPT_CHARS
    max_file_bytes: int = MAX_FILE_BYTES


class SkillCatalog:
    """The skills of one workspace across the six sources. Thread-safe; blocking I/O."""

    def __init__(self, dirs: list[tuple[str, Path]], *, workspace: Path | None,
                 limits: SkillLimits = SkillLimits(), home: str | None = None,
                 now=None) -> None:
        self.dirs = dirs
        self.workspace = workspace
        self.limits = limits
        self.home = home if home is not None else os.path.expanduser("~")
        self.now = now  # () -> epoch seconds, for the workspace timestamps index
        self._lock = threading.Lock()
        self._scan: SkillScan | None = None
        self._sig = SignatureCache(dirs)
        self._scanned_sig: tuple | None = None
        self._section: BudgetResult | None = None
        self.rescans = 0

    @classmethod
    def for_workspace(cls, workspace: Path, *, extra: list[Path], managed: Path | None,
                      personal: Path | None, bundled: bool = True,
                      limits: SkillLimits = SkillLimits(), now=None) -> SkillCatalog:
        dirs = source_dirs(extra=extra, managed=managed, personal=personal,
                           workspace=workspace, bundled=bundled)
        return cls(dirs, workspace=workspace, limits=limits, now=now)

    def signature(self) -> tuple:
        """``((SKILL.md path, mtime_ns, size), ...)`` of every source; ≤ 5 ms for 150+
        skills (a stat per skill; directories listed only when they changed)."""
        with self._lock:
            return self._sig.signature()

    def scan(self) -> SkillScan:
        """The current scan, re-read when a skill file changed."""
        with self._lock:
            sig = self._sig.signature()
            if self._scan is None or sig != self._scanned_sig:
                self._scan = scan(self.dirs, self.limits.max_file_bytes)
                self._scanned_sig = sig
                self._section = None
                self.rescans += 1
                self._stamp_workspace()
            return self._scan

    def section(self) -> BudgetResult:
        """The prompt's skills section for the current scan (cached with it)."""
        current = self.scan()
        with self._lock:
            if self._section is None:
                self._section = build_section(
                    list(current.skills.values()), max_skills=self.limits.max_skills,
                    max_chars=self.limits.max_chars, workspace=self.workspace,
                    home=self.home)
                if self._section.cut_by_count or self._section.cut_by_chars:
                    log.warning("skills_budget_cut", kept=len(self._section.included),
                                cut_by_count=self._section.cut_by_count,
                                cut_by_chars=self._section.cut_by_chars)
            return self._section

    def roots(self) -> list[Path]:
        """Every source directory (the ``read`` tool may read SKILL.md files there)."""
        return [d for _, d in self.dirs]

    def _stamp_workspace(self) -> None:
        # created/updated/last_used times of workspace skills (runtime/skills/index.py)
        if self.workspace is None or self.now is None:
            return
        try:
            load_skills(self.workspace, now=self.now())
        except OSError as exc:
            log.warning("skills_index_write_failed", workspace=str(self.workspace),
                        error=str(exc))
