"""The ``backup`` config section: where scheduled backups go, when, and how many are kept."""

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from runtime.config_types import ConfigModel


class BackupSection(ConfigModel):
    dir: str | None = Field(None, description="directory of scheduled backups (and of "
                            "`backup create` without --to); default <state_dir>/backups")
    schedule: str | None = Field(None, description="5-field crontab expression (or @daily, "
                                 "...) for automatic backups; unset = none")
    tz: str = Field("UTC", description="IANA timezone the schedule is read in")
    keep: int = Field(7, ge=1, description="scheduled backups kept in `dir` (older ones "
                      "are deleted after a successful backup; backups made by hand are "
                      "never deleted)")
    include_secrets: bool = Field(False, description="scheduled backups also hold "
                                  "tidegate.env and gateway.token")

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        from scheduler.cron import crontab
        crontab.parse(v.strip())  # ValueError names the bad field
        return v.strip()

    @field_validator("tz")
    @classmethod
    def _zone(cls, v: str) -> str:
        from scheduler.cron import crontab
        crontab.resolve_tz(v)
        return v


def backup_dir_problem(cfg: Any) -> str | None:
    """Why ``backup.dir`` cannot be used, or None. A folder inside the state dir is left
    out of every backup (the archives must not hold each other), so anywhere but the
    default ``<state_dir>/backups`` it would silently drop that folder's state
    (transcripts, a workspace) from the archive — the same rule as ``--to``."""
    if not cfg.backup.dir:
        return None
    state = Path(os.path.realpath(cfg.gateway.state_path))
    folder = Path(os.path.realpath(Path(cfg.backup.dir).expanduser()))
    if folder == state / "backups" or (folder != state and state not in folder.parents):
        return None
    where = "is the state dir" if folder == state else f"lies inside the state dir {state}"
    return (f"backup.dir: {folder} {where}, whose files it would leave out of every "
            "backup: use a directory outside the state dir, or leave backup.dir unset "
            f"for {state / 'backups'}")
