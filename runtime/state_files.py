"""Corrupt state files: what every store does when its file on disk cannot be used
(handbook "Bad input": a corrupt state file disables only its owner).

The owner (cron store, outbox, pairing, inbound dedupe ledger, heartbeat alert ledger)
calls :func:`report_corrupt` once per broken file: one structured ERROR
``state_file_corrupt`` with ``owner``, ``path``, ``error``, ``effect`` (what is disabled
or degraded) and ``fix`` (what the operator should do), and one line in the gateway's
``problems`` list, which ``tidegate status`` and ``/status`` show. The bytes are never
destroyed: a store that must go on writing copies them aside first
(:func:`keep_aside`, ``<name>.corrupt-<UTC stamp>``); a store that cannot go on leaves the
file where it is and refuses to overwrite it.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


def problem_text(owner: str, path: Path | str, error: str, effect: str, fix: str) -> str:
    """The ``problems`` line: ``"<owner>: <path> is unusable (<error>); <effect>. Fix:
    <fix>"``."""
    return f"{owner}: {path} is unusable ({error}); {effect}. Fix: {fix}"


def report_corrupt(owner: str, path: Path | str, error: str, *, effect: str, fix: str,
                   problems: list[str] | None = None) -> str:
    """Log the ERROR and add the problem line (once: an identical line is not repeated).
    Returns the problem line."""
    text = problem_text(owner, path, error, effect, fix)
    log.error("state_file_corrupt", owner=owner, path=str(path), error=error, effect=effect,
              fix=fix)
    if problems is not None and text not in problems:
        problems.append(text)
    return text


def clear_problem(problems: list[str] | None, text: str | None) -> None:
    """Drop a problem line once its file is usable again."""
    if problems is not None and text in problems:
        problems.remove(text)


def keep_aside(path: Path) -> Path | None:
    """Copy ``path`` to ``<name>.corrupt-<YYYYmmddTHHMMSSZ>`` next to it (the original stays
    until its owner replaces it). Returns the copy, or None when it could not be made (the
    owner must then not overwrite the original)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = path.with_name(f"{path.name}.corrupt-{stamp}")
    try:
        shutil.copy2(path, dest)
    except OSError as exc:
        log.error("state_file_keep_aside_failed", path=str(path), error=str(exc))
        return None
    return dest
