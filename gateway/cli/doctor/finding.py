"""One finding of ``tidegate doctor``: which check, its severity, what it found and the
exact fix (gateway/cli/doctor)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Finding:
    check: str
    severity: str           # ok | warning | error
    message: str
    fix: str = ""
    fixed: bool = False
