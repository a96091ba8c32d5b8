"""Stage 0 of the operator journey: what ``pip install`` puts on a user's disk.

The sdist and the wheel carry every non-Python file of the packages (the code opens them
at run time: the webchat page, bundled skills, the PostgreSQL migrations), and the
installed ``tidegate`` runs from the venv, not from the checkout.
"""

from __future__ import annotations

import subprocess
import tarfile
import zipfile
from pathlib import Path

from tests.journey.install import ROOT

PACKAGES = ("gateway", "channels", "runtime", "scheduler")


def _data_files() -> set[str]:
    """Every non-Python file under the packages, as tracked by git (the files a clean
    clone has), else as found on disk."""
    r = subprocess.run(["git", "ls-files", *PACKAGES], cwd=ROOT, capture_output=True,
                       text=True)
    if r.returncode == 0 and r.stdout.strip():
        names = r.stdout.split()
    else:
        names = [str(p.relative_to(ROOT)) for pkg in PACKAGES
                 for p in (ROOT / pkg).rglob("*") if p.is_file()]
    return {n for n in names if not n.endswith((".py", ".pyc")) and "__pycache__" not in n}


def test_the_packages_have_data_files_to_ship():
    """The check below is not vacuous: the packages hold data the code opens."""
    files = _data_files()
    assert "channels/webchat/static/index.html" in files
    assert any(f.startswith("runtime/storage/postgres/migrations/") and f.endswith(".sql")
               for f in files)


def test_wheel_and_sdist_ship_every_data_file(install):
    wanted = _data_files()
    with zipfile.ZipFile(install.wheel) as whl:
        in_wheel = set(whl.namelist())
    with tarfile.open(install.sdist) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        in_sdist = {n.removeprefix(f"{top}/") for n in sdist.getnames()}
    assert sorted(wanted - in_wheel) == [], "files the wheel does not ship"
    assert sorted(wanted - in_sdist) == [], "files the sdist does not ship"


def test_the_installed_tidegate_runs_from_the_venv(operator):
    r = operator.ok("--version")
    assert r.stdout.startswith("tidegate "), r.stdout
    py = operator.install.bin / "python"
    code = "import gateway, runtime; print(gateway.__file__); print(runtime.__file__)"
    where = subprocess.run([py, "-c", code], cwd=operator.home,
                           env=operator.env(), capture_output=True, text=True, check=True)
    for line in where.stdout.split():
        path = Path(line).resolve()
        assert path.is_relative_to(operator.install.root.resolve()), path
        assert not path.is_relative_to(ROOT), f"{path} is the checkout, not the install"
    shipped = Path(where.stdout.split()[1]).parent / "storage" / "postgres" / "migrations"
    assert sorted(p.name for p in shipped.glob("*.sql")) == sorted(
        Path(f).name for f in _data_files() if f.endswith(".sql"))
