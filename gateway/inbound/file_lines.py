"""Whether a command brings a file a stranger sent into its turn (docs/exec.md "Tainted
turns", the ``exec`` rule): ``ToolContext.extra["exec_taint"]``
(runtime/tools/file_taint.py ``note_output_taint``).

The rule, cheap and conservative, over the received files of the agent whose sender is
not an owner (gateway/inbound/provenance.py) and that are still in the workspace:

- the command names one: its workspace path, its file name, or the ``inbox`` directory
  that holds it (``cat inbox/*/*``, ``ls inbox``);
- or the output holds one of its lines: a line of at least :data:`MIN_LINE` characters
  (spaces at the ends ignored), also behind a ``cat -n``/``grep -n``/``grep file:``
  prefix, or the whole file's text.

Not covered: output that transforms the text (``base64``, ``tr``, compression, a line
cut in the middle), lines shorter than :data:`MIN_LINE`, binary files, files over
:data:`MAX_FILE_BYTES`, and a received file deleted from the workspace whose copy is
then printed under another name.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

MIN_LINE = 12
MAX_FILE_BYTES = 2 * 1024 * 1024
MAX_LINES = 20_000
_NUMBERED = re.compile(r"^\d+[\t:\-]\s?")  # cat -n, grep -n, nl
_INBOX = re.compile(r"(?<![\w.-])inbox(?![\w.-])")

_cache: dict[tuple[str, int, int], tuple[frozenset[str], str]] = {}
_lock = threading.Lock()


def _lines_of(path: Path) -> tuple[frozenset[str], str] | None:
    """(the lines worth matching, the whole stripped text) of the text file at ``path``;
    None when it is missing, binary (not UTF-8) or too big. Cached by path, size, mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_size > MAX_FILE_BYTES:
        return None
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _cache:
            return _cache[key]
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    lines = frozenset(s for ln in text.splitlines()[:MAX_LINES]
                      if len(s := ln.strip()) >= MIN_LINE)
    found = (lines, text.strip())
    with _lock:
        if len(_cache) > 1000:  # bounded: files come and go
            _cache.clear()
        _cache[key] = found
    return found


def _candidates(line: str) -> set[str]:
    """An output line as printed, and without a line-number or ``file:`` prefix."""
    s = line.strip()
    out = {s, _NUMBERED.sub("", s).strip()}
    for part in s.split(":", 2)[1:]:
        out.add(part.strip())
        out.add(_NUMBERED.sub("", part.strip()).strip())
    if ":" in s:
        out.add(s.split(":", 2)[-1].strip())
    return out


def output_holds(output: str, lines: frozenset[str], whole: str) -> bool:
    """Whether ``output`` holds a line of the file (``lines``) or its whole text."""
    if len(whole) >= MIN_LINE and whole in output:
        return True
    return any(c in lines for ln in output.splitlines() for c in _candidates(ln)
               if len(c) >= MIN_LINE)


def canonical_of(gw: Any) -> Any:
    """``(channel, sender) -> canonical sender id`` under the configured identity links."""
    from gateway.routing import IdentityLinks, canonical_sender
    links = IdentityLinks(gw.config.session.identity_links)
    return lambda ch, sender: canonical_sender(links, ch, sender)


def exec_taint(gw: Any, agent_id: str, command: str, output: str) -> str | None:
    """Why running ``command`` with ``output`` taints a turn of ``agent_id`` (module
    docstring), or None. Reads files: call it from a worker thread."""
    provenance = getattr(gw, "provenance", None)
    approvals = getattr(gw, "approvals", None)
    if provenance is None or approvals is None:
        return None
    workspace = gw.config.workspace_for(agent_id)
    canonical = canonical_of(gw)
    for rel, channel, sender in reversed(provenance.received(agent_id)):
        if approvals.sender_taint(agent_id, channel, sender) is None:
            continue
        who = f"file from {canonical(channel, sender)}: {rel}"
        name = rel.rsplit("/", 1)[-1]
        if rel in command or name in command:
            return f"exec naming {who}"
        if rel.startswith("inbox/") and _INBOX.search(command):
            return f"exec in the inbox, which holds {who}"
        found = _lines_of(workspace / rel) if output else None
        if found is not None and output_holds(output, *found):
            return f"exec output holding {who}"
    return None
