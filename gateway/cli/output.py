"""Output helpers shared by every command group of the CLI."""

from __future__ import annotations

import json
from typing import Any


def print_json(data: Any) -> None:
    """Pretty JSON on stdout (every ``--json`` output of the CLI)."""
    print(json.dumps(data, indent=2, ensure_ascii=False))
