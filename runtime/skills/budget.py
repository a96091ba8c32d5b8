"""The skills section of the prompt and its budget (seed 001 §7 "budget control", seed 003
§4 "always" skills and the skills catalogue).

Offered skills (requirements met) are ordered ``always`` first, then by source precedence
(workspace, project, personal, managed, bundled, extra: the operator's own skills before
shipped ones), then by name. At most
``max_skills`` are kept; then, when the rendered text exceeds ``max_chars``, the largest
prefix of that order that fits is found by binary search (the rendered length only grows
with the prefix). Paths under ``$HOME`` are written with ``~``; workspace skills use
their workspace-relative path (what the ``read`` tool takes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.skills.sources import SOURCES, Skill

HEADER = ("# Skills\nSkills are instructions for specific tasks. When one applies, read its "
          "SKILL.md with the read tool first and follow it.")


@dataclass(frozen=True, slots=True)
class BudgetResult:
    """The rendered section ("" without skills), the skills it includes, and how many
    offered skills were cut by the count and by the character budget."""

    text: str
    included: tuple[str, ...]
    cut_by_count: int
    cut_by_chars: int


def display_path(path: Path, *, workspace: Path | None, home: str | None) -> str:
    """``skills/x/SKILL.md`` inside the workspace, ``~/...`` under ``home``, else as is."""
    if workspace is not None:
        try:
            return str(path.relative_to(workspace))
        except ValueError:
            pass
    text = str(path)
    if home and home != "/" and (text == home or text.startswith(home.rstrip("/") + "/")):
        return "~" + text[len(home.rstrip("/")):]
    return text


def _entry(skill: Skill, shown: str) -> str:
    line = f"- {skill.name}: {skill.description} ({shown})"
    if skill.always and skill.body:
        return f"{line}\n<skill name=\"{skill.name}\">\n{skill.body}\n</skill>"
    return line


def render(entries: list[str]) -> str:
    return HEADER + "\n" + "\n".join(entries) if entries else ""


def largest_prefix(entries: list[str], max_chars: int) -> int:
    """The largest k with ``len(render(entries[:k])) <= max_chars`` (binary search over
    k; the length is monotonic in k)."""
    lo, hi = 0, len(entries)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(render(entries[:mid])) <= max_chars:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _rank(source: str) -> int:
    """Precedence of a source (higher wins; unknown sources lowest)."""
    return SOURCES.index(source) if source in SOURCES else -1


def build_section(skills: list[Skill], *, max_skills: int, max_chars: int,
                  workspace: Path | None, home: str | None) -> BudgetResult:
    """Render the offered ``skills`` within the budget (module docstring)."""
    offered = sorted((s for s in skills if s.available),
                     key=lambda s: (not s.always, -_rank(s.source), s.name))
    counted = offered[:max_skills]
    entries = [_entry(s, display_path(s.path, workspace=workspace, home=home))
               for s in counted]
    keep = largest_prefix(entries, max_chars)
    return BudgetResult(render(entries[:keep]), tuple(s.name for s in counted[:keep]),
                        len(offered) - len(counted), len(counted) - keep)
