"""Skills (seed 001 §7, seed 003 §4): prompt-level knowledge packs from six sources.

``sources`` (where skills come from, precedence, requirements), ``frontmatter``
(SKILL.md metadata), ``budget`` (the prompt section within its limits), ``catalog``
(one agent's cached skills), ``index`` (timestamps of workspace skills), ``install``
(``tidegate skills install``), ``bundled/`` (skills shipped with tidegate).
"""

from runtime.skills.index import load_skills, mark_used, skill_dir_of

__all__ = ["load_skills", "mark_used", "skill_dir_of"]
