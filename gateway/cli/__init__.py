"""The ``tidegate`` command line: one module per command group (``sessions``, ``cron``,
``scheduler`` for system events and heartbeat, ``timeline``, ``pairing``, ``service``,
``doctor``, ``setup``, ``storage``, ``skills``, ``tools``, ...). ``main`` holds the parser
and the core commands (``logs`` reads through gateway/logs/reader.py); ``client`` is the
control-API client every online command uses.
"""

from gateway.cli.fast_start import lean_imports

with lean_imports():
    from gateway.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
