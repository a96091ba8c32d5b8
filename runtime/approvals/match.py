"""Matching a shell command against allowlist patterns on its parsed argv.

A command is matched only when it is one plain command: no shell metacharacter outside
quotes (``;`` ``&`` ``|`` ``<`` ``>`` ``(`` ``)`` newline, and ``$`` or a backquote outside
single quotes — command substitution and variable expansion), so ``ls *; id`` or
``ls $(id)`` never matches ``ls *``. The command is split with :mod:`shlex` (POSIX rules);
its first word is resolved to the binary the shell would run (``PATH`` lookup, symlinks
followed), and so is the pattern's, so ``/usr/bin/git status`` and ``git status`` are the
same command while ``./git status`` is not.

Pattern words: a literal word matches the same word; a word with ``*``/``?``/``[...]``
matches one argument by :func:`fnmatch.fnmatchcase`; a final lone ``*`` matches any number
of further arguments (none included): ``git log *`` matches ``git log`` and
``git log --oneline -5``.

A command word the shell expands — an unquoted ``*``, ``?`` or ``[``, or a leading
unquoted ``~`` (:func:`expanded_words`) — becomes file names nobody has seen, so it
matches only under a pattern's final lone ``*``, never a pattern word: after "always
allow" of ``find . -name '*'`` (stored as ``find . -name '[*]'``), ``find . -name *`` asks.
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import shutil

import structlog

log = structlog.get_logger(__name__)

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_warned_paths: set[tuple[str, str | None]] = set()

_META = set(";&|<>()\n\r")


class NotPlain(ValueError):
    """The command is not one plain command (the message says what was found)."""


def _check_plain(command: str) -> None:
    quote = ""
    escaped = False
    for ch in command:
        if escaped:
            escaped = False
            continue
        if quote == "'":
            if ch == "'":
                quote = ""
            continue
        if ch == "\\":
            escaped = True
            continue
        if ch in "$`":
            raise NotPlain(f"shell expansion {ch!r}")
        if quote == '"':
            if ch == '"':
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in _META:
            raise NotPlain(f"shell metacharacter {ch!r}")
    if quote or escaped:
        raise NotPlain("unbalanced quoting")


def parse_command(command: str) -> list[str]:
    """The argv of a plain command. Raises NotPlain for anything else (several commands,
    pipes, redirections, substitutions, unbalanced quotes, an empty command)."""
    _check_plain(command)
    try:
        argv = shlex.split(command, posix=True)
    except ValueError as exc:
        raise NotPlain(str(exc)) from None
    if not argv:
        raise NotPlain("empty command")
    if "=" in argv[0] and not argv[0].startswith(("=", "/", ".")):
        raise NotPlain("variable assignment before the command")
    return argv


def _inside(entry: str, workspace: str | None) -> bool:
    if not workspace:
        return False
    root, real = os.path.realpath(workspace), os.path.realpath(entry)
    return real == root or real.startswith(root.rstrip("/") + "/")


def exec_path(path: str | None, workspace: str | None = None) -> str:
    """``path`` (a ``PATH`` value; None/empty = :data:`DEFAULT_PATH`) without its empty and
    relative entries: an empty entry (``:/usr/bin``, ``/bin:``, ``a::b``) or ``.`` makes
    the shell look in the command's working directory, which the agent writes, so the
    allowlist would check one binary and the shell run another. Commands get this
    ``PATH`` and the allowlist resolves with it; what is dropped is logged once per value
    (``exec_path_entries_dropped``). An absolute entry inside ``workspace`` (the
    command's working directory) is dropped too, for the same reason."""
    entries = (path or DEFAULT_PATH).split(os.pathsep)
    kept = [e for e in entries if e.startswith("/") and not _inside(e, workspace)]
    if len(kept) != len(entries) and (path, workspace) not in _warned_paths:
        _warned_paths.add((path or "", workspace))
        log.warning("exec_path_entries_dropped", dropped=[e for e in entries
                                                          if e not in kept],
                    kept=os.pathsep.join(kept),
                    why="empty, relative or in-workspace PATH entries would run "
                        "files the agent writes")
    return os.pathsep.join(kept) if kept else DEFAULT_PATH


def expanded_words(command: str) -> frozenset[int]:
    """Indexes of the words of plain ``command`` (as :func:`parse_command` splits it) that
    the shell expands: an unquoted, unescaped ``*``, ``?`` or ``[`` (a file-name glob), or
    an unquoted ``~`` at the start (the home directory)."""
    found: set[int] = set()
    index, in_word, quote, escaped = -1, False, "", False
    for ch in command:
        if not in_word and not quote and not escaped and ch in " \t":
            continue
        if not in_word:
            index, in_word = index + 1, True
            if ch == "~":
                found.add(index)
        if escaped:
            escaped = False
        elif quote == "'":
            quote = "" if ch == "'" else quote
        elif quote == '"':
            if ch == "\\":
                escaped = True
            elif ch == '"':
                quote = ""
        elif ch == "\\":
            escaped = True
        elif ch in "'\"":
            quote = ch
        elif ch in " \t":
            in_word = False
        elif ch in "*?[":
            found.add(index)
    return frozenset(found)


def resolve_binary(word: str, path: str | None, cwd: str | None = None) -> str:
    """The real path of the program ``word`` names (``PATH`` lookup for a bare name,
    relative to ``cwd`` for ``./x``), or ``word`` itself when nothing is found."""
    if "/" in word:
        full = os.path.join(cwd or os.getcwd(), word)
    else:
        full = shutil.which(word, path=exec_path(path, cwd)) or ""
    return os.path.realpath(full) if full and os.path.exists(full) else word


def pattern_matches(pattern: str, argv: list[str], *, path: str | None,
                    cwd: str | None = None, expanded: frozenset[int] = frozenset()) -> bool:
    """Whether ``argv`` (from :func:`parse_command`) matches one allowlist ``pattern``.
    ``expanded``: indexes of words the shell expands (:func:`expanded_words`), which
    match only under a final lone ``*``. A pattern that does not parse matches nothing."""
    try:
        words = shlex.split(pattern, posix=True)
    except ValueError:
        return False
    if not words or 0 in expanded:
        return False
    if resolve_binary(words[0], path, cwd) != resolve_binary(argv[0], path, cwd):
        return False
    rest_p, rest_a = words[1:], argv[1:]
    if rest_p and rest_p[-1] == "*":
        fixed = rest_p[:-1]
        if len(rest_a) < len(fixed):
            return False
        rest_a = rest_a[:len(fixed)]
        rest_p = fixed
    return len(rest_p) == len(rest_a) and all(
        i + 1 not in expanded and fnmatch.fnmatchcase(a, p)
        for i, (p, a) in enumerate(zip(rest_p, rest_a, strict=True)))


def exact_pattern(argv: list[str], *, path: str | None, cwd: str | None = None) -> str:
    """The pattern that matches exactly ``argv`` ("always allow"): the resolved binary
    and every argument quoted, glob characters escaped."""
    def lit(word: str) -> str:
        return "".join(f"[{c}]" if c in "*?[" else c for c in word)
    return shlex.join([resolve_binary(argv[0], path, cwd)] + [lit(a) for a in argv[1:]])


def first_match(patterns: list[str], argv: list[str], *, path: str | None,
                cwd: str | None = None, expanded: frozenset[int] = frozenset()) -> str | None:
    """The first of ``patterns`` that matches ``argv``, or None."""
    return next((p for p in patterns if pattern_matches(p, argv, path=path, cwd=cwd,
                                                        expanded=expanded)), None)
