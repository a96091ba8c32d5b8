"""The ``tidegate`` command line: one module per command group (``sessions``, ``cron``,
``scheduler`` for system events and heartbeat, ``timeline``, ``pairing``, ``service``,
``doctor``, ``setup``, ``storage``, ``skills``, ``tools``, ...). ``main`` holds the parser
and the core commands (``logs`` reads through gateway/logs/reader.py); ``client`` is the
control-API client every online command uses.

``tidegate --version`` alone imports nothing else (``fast_start.version_main``): the
parser and the ~700 modules behind it cost ~0.7 s of CPU that a version check does not
need.
"""

import sys

from gateway.cli.fast_start import lean_imports, version_main, version_only

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
