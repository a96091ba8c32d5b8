"""What keeps ``tidegate agent -m`` and ``chat`` starting fast (issue 14 ``bench/``,
bench/operator_bench.py): which commands skip the extension groups, ``ssl`` kept out of a
loopback-only process, and argparse types and actions that import their modules only when
used.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator


def nonneg_int(text: str) -> int:
    """``gateway.logs.records.nonneg_int``, imported when used (it pulls in asyncio):
    ``agent -m`` starts without it."""
    from gateway.logs.records import nonneg_int as parse
    return parse(text)


def when_parser(now: float) -> Callable[[str], float]:
    def when(text: str) -> float:
        from gateway.logs.records import parse_when
        return parse_when(text, now)
    return when


# Commands whose start-up time matters and that need no extension group: the chat
# clients, and the daemon itself (issue 9 "cold start": the extensions add ~30 modules).
FAST_COMMANDS = ("agent", "chat", "gateway")
LOOPBACK_ONLY = ("agent", "chat")  # they only talk to this gateway's control API


def command_word(argv: list[str]) -> str | None:
    """The subcommand named on the command line (skipping ``--config X`` and
    ``--env-file X``), or None."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in ("--config", "--env-file"):
            skip = True
        elif not word.startswith("-"):
            return word
    return None


def without_tls() -> None:
    """``agent``/``chat`` as their own process talk plain HTTP to loopback and exit: keep
    http.client from importing ssl (16 ms of CPU at every start, bench/operator_bench.py).
    A ``None`` in sys.modules makes that optional import fail; the entry is removed again
    right after, so a later ``import ssl`` works as usual."""
    if "http.client" in sys.modules or "ssl" in sys.modules:
        return
    sys.modules["ssl"] = None  # type: ignore[assignment]
    try:
        import http.client  # noqa: F401 - imported now, without HTTPSConnection
    finally:
        del sys.modules["ssl"]


def without_pydantic_plugins() -> None:
    """Tell pydantic this process has no plugins (tidegate uses none), so that it never
    reads every installed distribution's entry points to look for some (~10 ms, at the
    first model built outside ``lean_imports``: the config sections are built when the
    config is validated). It keeps the list it found in ``_plugins``; seeding that private
    cache fails safe: if a release renames it, pydantic just looks as before. An operator
    who set ``PYDANTIC_DISABLE_PLUGINS`` keeps pydantic's own handling of it."""
    if "PYDANTIC_DISABLE_PLUGINS" in os.environ:
        return
    from pydantic.plugin import _loader

    if getattr(_loader, "_plugins", False) is None:
        _loader._plugins = {}


@contextlib.contextmanager
def lean_imports() -> Iterator[None]:
    """Import the command line without two costs that buy nothing at start (issue 9, cold
    start): the cyclic GC, which the ~70 config classes and ~700 modules being built trip
    hundreds of times with nothing to collect (restored on exit), and pydantic's plugin
    discovery (``without_pydantic_plugins``, for the rest of the process; not for
    ``agent``/``chat``, which never import pydantic)."""
    gc_was_on = gc.isenabled()
    gc.disable()
    if command_word(sys.argv[1:]) not in LOOPBACK_ONLY:  # agent/chat never load pydantic:
        without_pydantic_plugins()  # seeding would import it (~60 ms) and importlib.metadata
    try:
        yield
    finally:
        if gc_was_on:
            gc.enable()


class VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked (reading package
    metadata costs every other command's start-up time)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"tidegate {version()}")
        parser.exit()


def version_only(argv: list[str]) -> bool:
    """True when ``argv`` (the words after the program name) asks only for the version:
    ``--version`` with no subcommand (``--config X`` may precede it)."""
    return "--version" in argv and command_word(argv) is None


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("tidegate")
    except PackageNotFoundError:
        return "0+unknown"
