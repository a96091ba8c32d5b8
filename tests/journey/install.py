"""Build tidegate's sdist and wheel and install the wheel into a fresh venv outside the
checkout, the way a user installs it (``pip install tidegate-*.whl``).

As a script (``.ci/run`` runs it once per CI run, before the suite)::

    python tests/journey/install.py DEST      # prints DEST/venv/bin, exit 0

``DEST/dist`` then holds the sdist and the wheel, ``DEST/venv`` the installed product.
The journey fixture (tests/journey/conftest.py) uses an install named by
``$TIDEGATE_JOURNEY_INSTALL`` (DEST) or makes its own with ``ensure_install``.
Standard library only: the journey imports nothing of the product.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Install:
    """A built and installed tidegate: ``dist`` (sdist + wheel), ``bin`` (the venv's
    ``bin/``, holding ``tidegate`` and the venv's ``python``)."""

    root: Path

    @property
    def dist(self) -> Path:
        return self.root / "dist"

    @property
    def bin(self) -> Path:
        return self.root / "venv" / "bin"

    @property
    def wheel(self) -> Path:
        return _one(self.dist, "*.whl")

    @property
    def sdist(self) -> Path:
        return _one(self.dist, "*.tar.gz")


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise RuntimeError(f"expected one {pattern} in {folder}, found {found}")
    return found[0]


def _run(*cmd: str | Path, cwd: Path | None = None) -> None:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n"
                           f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}")


def build_and_install(dest: Path, python: str = sys.executable) -> Install:
    """Build the sdist and the wheel of the checkout (``python -m build``: the wheel is
    built from the sdist, so both must carry every file) into ``dest/dist`` and install
    the wheel into the new venv ``dest/venv``. Raises RuntimeError with the tool's output
    when a step fails. Writes ``dest/installed.json`` last, as the mark of a whole install."""
    inst = Install(dest)
    inst.dist.mkdir(parents=True, exist_ok=True)
    _run(python, "-m", "build", "--outdir", inst.dist, ROOT, cwd=dest)
    venv.EnvBuilder(with_pip=True, clear=True).create(dest / "venv")
    _run(inst.bin / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
         inst.wheel, cwd=dest)
    (dest / "installed.json").write_text(json.dumps({"wheel": inst.wheel.name}))
    return inst


def ensure_install(dest: Path) -> Install:
    """The install in ``dest``, built once even when several test workers ask at once
    (an exclusive lock on ``dest/.lock``)."""
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / "installed.json").exists():
            return Install(dest)
        return build_and_install(dest)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/journey/install.py DEST")
    print(ensure_install(Path(sys.argv[1]).absolute()).bin)
