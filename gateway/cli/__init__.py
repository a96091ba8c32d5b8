"""The ``tidegate`` command line: one module per command group.

``main`` (the parser and the core commands), ``sessions``, ``scheduler`` (cron, system
events, heartbeat), ``timeline``, ``pairing``, ``service``, ``log_reader`` (``logs``), and
``client``, the control-API client every online command uses.
"""

from gateway.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
