"""Memory scopes: whose an entry is, who may read and write it, and the scoped entries'
files (issue "per-user memory").

Scopes: ``agent`` (shared: ``MEMORY.md`` and ``memory/*.md`` in the workspace),
``user:<canonical sender id>`` and ``group:<conversation id>``. A canonical sender id is an
identity-link name (``alice``: one person on several platforms) or ``<channel>:<id>``; a
conversation id is ``<channel>:<group id>``. Scoped entries live outside the workspace
(the file tools cannot reach them), one Markdown file per scope:
``<scopes>/user/<quoted id>.md`` and ``<scopes>/group/<quoted id>.md``, a paragraph per
entry with its ``<!-- ts: ... -->`` stamp. Deleting entries rewrites the file without
them (atomic replace): the text is gone from disk.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from urllib.parse import quote, unquote

from runtime.memory.paragraphs import Paragraph, entry_text, parse_paragraphs

AGENT = "agent"
KINDS = ("user", "group")


@dataclass(frozen=True, slots=True)
class Asker:
    """Who a memory call acts for: ``user`` the canonical sender id (None: the operator —
    a local surface, the heartbeat, cron), ``group`` the conversation id in a shared
    chat (None in a DM), ``owner`` whether the sender is one of the agent's owners,
    ``aliases`` the ``<channel>:<id>`` ids an identity link maps to ``user`` (their notes
    saved before the link are still theirs: searched, listed, deletable)."""

    user: str | None = None
    group: str | None = None
    owner: bool = False
    aliases: tuple[str, ...] = ()  # other ids whose user scopes are this person's (links)

    @property
    def operator(self) -> bool:
        return self.user is None

    def visible(self) -> list[str]:
        """The scopes this asker's searches see: agent + the group's + the sender's own."""
        out = [AGENT]
        if self.group:
            out.append(f"group:{self.group}")
        if self.user:
            out.append(f"user:{self.user}")
            out += [f"user:{a}" for a in self.aliases]
        return out

    @property
    def writes_agent(self) -> bool:
        """Whether this asker may write the agent scope (MEMORY.md, memory/*.md)."""
        return self.operator or self.owner


def split_scope(scope: str) -> tuple[str, str]:
    """``("user", "telegram:1")`` for ``user:telegram:1``. ValueError for other forms."""
    kind, sep, ident = scope.partition(":")
    if not sep or kind not in KINDS or not ident.strip():
        raise ValueError(f"not a memory scope: {scope!r} (user:<id> or group:<id>)")
    return kind, ident


def scope_path(scopes_dir: Path, scope: str) -> Path:
    """The file of a user/group scope. ValueError for ``agent`` or a malformed scope."""
    kind, ident = split_scope(scope)
    return scopes_dir / kind / f"{quote(ident, safe='')}.md"


def scope_files(scopes_dir: Path) -> list[tuple[Path, str, str]]:
    """(path, path shown, scope) of every scope file under ``scopes_dir``."""
    out = []
    for kind in KINDS:
        d = scopes_dir / kind
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            if p.suffix == ".md" and p.is_file():
                out.append((p, f"scopes/{kind}/{p.name}", f"{kind}:{unquote(p.stem)}"))
    return out


class ScopeStore:
    """Append, list and delete the entries of user/group scopes under ``root``. Blocking
    (small files); call from a worker thread. Thread-safe within one process."""

    def __init__(self, root: str | Path, tz: tzinfo) -> None:
        self.root = Path(root)
        self.tz = tz
        self._lock = threading.Lock()

    def append(self, scope: str, text: str, now: float) -> Paragraph:
        """Add one entry (stamped ``now``, epoch seconds) to ``scope``; returns it. The
        text is one entry whatever it holds (paragraphs.entry_text)."""
        path = scope_path(self.root, scope)
        stamp = datetime.fromtimestamp(now, self.tz).isoformat(timespec="seconds")
        block = f"{entry_text(text)}\n<!-- ts: {stamp} -->\n"
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            old = path.read_text(encoding="utf-8") if path.exists() else ""
            gap = "" if not old.strip() else ("\n" if old.endswith("\n") else "\n\n")
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(gap + block)
                fh.flush()
                os.fsync(fh.fileno())
        return self.entries(scope)[-1]

    def entries(self, scope: str) -> list[Paragraph]:
        """The entries of ``scope``, oldest first ([] when it has none)."""
        path = scope_path(self.root, scope)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        paras = parse_paragraphs(text, f"scopes/{path.parent.name}/{path.name}",
                                 path.stat().st_mtime, tz=self.tz)
        for p in paras:
            p.scope = scope
        return paras

    def forget(self, scope: str, ids: list[str] | None = None) -> list[Paragraph]:
        """Delete the entries of ``scope`` whose ``entry_id`` is in ``ids`` (None: all);
        returns the deleted ones. The file is replaced atomically (removed when empty)."""
        path = scope_path(self.root, scope)
        with self._lock:
            entries = self.entries(scope)
            gone = [e for e in entries if ids is None or e.entry_id in ids]
            if not gone:
                return []
            keep = [e for e in entries if e not in gone]
            if not keep:
                path.unlink(missing_ok=True)
                return gone
            body = "\n".join(
                f"{e.text}\n<!-- ts: {datetime.fromtimestamp(e.created_at, self.tz).isoformat(timespec='seconds')} -->\n"
                for e in keep)
            tmp = path.with_suffix(".tmp")
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        return gone

    def scopes(self) -> list[str]:
        """Every scope that has a file."""
        return [scope for _, _, scope in scope_files(self.root)]
