"""The ``skills`` config section (seed 001 §7 sources and budget)."""


from pydantic import Field

from runtime.config_types import ConfigModel

MAX_SKILLS = 150
MAX_PROMPT_CHARS = 30_000
MAX_FILE_BYTES = 256 * 1024


class SkillsSection(ConfigModel):
    """``extra_dirs``: lowest-precedence skill directories; ``personal_dir``: the
    personal source (``~/.agents/skills``); ``managed_dir``: where ``tidegate skills
    install`` puts skills (default ``<state_dir>/skills``); budget: ``max_skills``,
    ``max_prompt_chars`` of skills text in the prompt, ``max_file_bytes`` per SKILL.md."""

    extra_dirs: list[str] = Field(
        [],
        description="lowest-precedence skill directories.")
    personal_dir: str = Field(
        "~/.agents/skills",
        description="Your own skills, shared by every agent.")
    managed_dir: str | None = Field(
        None,
        description="tidegate skills install target; null = <state_dir>/skills.")
    bundled: bool = Field(
        True,
        description="offer the skills shipped with tidegate (scheduling, memory, subagents)")
    max_skills: int = Field(MAX_SKILLS, ge=0,
        description="skills listed in the prompt.")
    max_prompt_chars: int = Field(MAX_PROMPT_CHARS, ge=0,
        description="characters of skills text in the prompt (largest prefix that fits)")
    max_file_bytes: int = Field(MAX_FILE_BYTES, ge=1,
        description="a bigger SKILL.md is skipped.")
