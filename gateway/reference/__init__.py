"""Reference pages generated from the code: the configuration schema, the CLI's argparse
tree, the metrics registry and the HTTP route table.

``python -m gateway.reference`` writes them under ``docs/reference/``;
``python -m gateway.reference --check`` exits 1 and names the pages that differ from what
the code generates now (tests/test_docs.py runs the same comparison).
"""

from __future__ import annotations

from collections.abc import Callable

REGENERATE = "python -m gateway.reference"


def pages() -> dict[str, Callable[[], str]]:
    """``{path under docs/: render function}`` of every generated page."""
    from gateway.reference import cli_ref, config_ref, http_ref, metrics_ref
    return {"reference/configuration.md": config_ref.render,
            "reference/cli.md": cli_ref.render,
            "reference/metrics.md": metrics_ref.render,
            "reference/http-api.md": http_ref.render}
