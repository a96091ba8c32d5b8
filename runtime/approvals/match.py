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
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import shutil

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


def resolve_binary(word: str, path: str | None, cwd: str | None = None) -> str:
    """The real path of the program ``word`` names (``PATH`` lookup for a bare name,
    relative to ``cwd`` for ``./x``), or ``word`` itself when nothing is found."""
    if "/" in word:
        full = os.path.join(cwd or os.getcwd(), word)
    else:
        full = shutil.which(word, path=path) or ""
    return os.path.realpath(full) if full and os.path.exists(full) else word


def pattern_matches(pattern: str, argv: list[str], *, path: str | None,
                    cwd: str | None = None) -> bool:
    """Whether ``argv`` (from :func:`parse_command`) matches one allowlist ``pattern``.
    A pattern that does not parse matches nothing."""
    try:
        words = shlex.split(pattern, posix=True)
    except ValueError:
        return False
    if not words:
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
        fnmatch.fnmatchcase(a, p) for p, a in zip(rest_p, rest_a, strict=True))


def exact_pattern(argv: list[str], *, path: str | None, cwd: str | None = None) -> str:
    """The pattern that matches exactly ``argv`` ("always allow"): the resolved binary
    and every argument quoted, glob characters escaped."""
    def lit(word: str) -> str:
        return "".join(f"[{c}]" if c in "*?[" else c for c in word)
    return shlex.join([resolve_binary(argv[0], path, cwd)] + [lit(a) for a in argv[1:]])


def first_match(patterns: list[str], argv: list[str], *, path: str | None,
                cwd: str | None = None) -> str | None:
    """The first of ``patterns`` that matches ``argv``, or None."""
    return next((p for p in patterns if pattern_matches(p, argv, path=path, cwd=cwd)), None)
