"""``python -m gateway.reference [--check] [--docs DIR]``: write (or check) the generated
reference pages. Exit 0 when written or up to date, 1 when ``--check`` found a page that
differs (each is named, with the command that regenerates it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.reference import REGENERATE, pages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gateway.reference")
    p.add_argument("--check", action="store_true", help="compare, write nothing")
    p.add_argument("--docs", default="docs", help="the docs directory (default: docs)")
    args = p.parse_args(argv)
    root = Path(args.docs)
    stale = []
    for rel, render in pages().items():
        text = render()
        path = root / rel
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; regenerate with: {REGENERATE}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
