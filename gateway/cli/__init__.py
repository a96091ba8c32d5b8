"""The ``tidegate`` command line: one module per command group (``sessions``, ``cron``,
``scheduler`` for system events and heartbeat, ``timeline``, ``pairing``, ``service``,
``doctor``, ``setup``, ``storage``, ``skills``, ``tools``, ...). ``main`` holds the parser
and the core commands (``logs`` reads through gateway/logs/reader.py); ``client`` is the
control-API client every online command uses.

``tidegate --version`` alone imports nothing else (``version_main``): the
parser and the ~700 modules behind it cost ~0.7 s of CPU that a version check does not
need.
"""

import sys

from gateway.cli.fast_start import lean_imports, version, version_only


def version_main(argv: list[str] | None = None) -> int:
    """The entry point of a process started as ``tidegate --version``: prints
    ``tidegate <version>`` and returns 0 without importing the parser (pydantic,
    aiohttp, structlog stay unloaded). Any other ``argv`` goes to the full
    ``gateway.cli.main.main``."""
    words = sys.argv[1:] if argv is None else argv
    if version_only(words):
        print(f"tidegate {version()}")
        return 0
    with lean_imports():
        from gateway.cli.main import main as full
    return full(argv)


if version_only(sys.argv[1:]):
    main = version_main
else:
    with lean_imports():
        from gateway.cli.main import build_parser, main


def __getattr__(name: str):
    """``build_parser`` in a ``--version`` process (imported only when asked for)."""
    if name == "build_parser":
        with lean_imports():
            from gateway.cli.main import build_parser as found
        return found
    raise AttributeError(f"module 'gateway.cli' has no attribute {name!r}")


__all__ = ["build_parser", "main"]
