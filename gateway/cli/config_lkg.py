"""``tidegate config diff-lkg``: what changed between the last-known-good config
(``<state_dir>/config.lkg.yaml``) and the config file now, as a unified diff.

Works when the config file is broken (that is when it is needed): the state dir is found
as leniently as the gateway's start finds it. Exit codes as diff(1): 0 the same, 1 they
differ, 2 no config file or no last-known-good config yet.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from gateway.config.lkg import lkg_path, where
from gateway.config.load import ConfigError


def diff_lkg(args: argparse.Namespace) -> int:
    """Print the diff; the exit code (module docstring)."""
    try:
        path, state = where(args.config, os.environ)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    lkg = lkg_path(state)
    if path is None:
        print("error: no config file (built-in defaults): nothing to compare", file=sys.stderr)
        return 2
    if not lkg.is_file():
        print(f"error: no last-known-good config at {lkg} yet (a config is kept once it "
              "has served config.lkg_after)", file=sys.stderr)
        return 2
    try:
        old = lkg.read_text(encoding="utf-8").splitlines(keepends=True)
        new = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    diff = list(difflib.unified_diff(old, new, fromfile=f"{lkg} (last known good)",
                                     tofile=str(path)))
    if not diff:
        print(f"no difference: {path} is the last-known-good config")
        return 0
    sys.stdout.writelines(line if line.endswith("\n") else line + "\n" for line in diff)
    return 1
