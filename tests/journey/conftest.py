"""Fixtures of the operator-journey tests: the installed wheel, an operator with a private
``HOME``, and the fake platforms and model in background threads.

The journey runs the product as users run it: built (sdist, then the wheel from it),
installed into a venv outside the checkout, started from a shell that exported nothing
(tests/journey/install.py, tests/journey/driver.py). ``.ci/run`` builds that install once
and names it in ``$TIDEGATE_JOURNEY_INSTALL``; without it the first journey test builds
one (about a minute), shared by the test workers of that run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.journey.driver import Operator
from tests.journey.install import Install, ensure_install


@pytest.fixture(scope="session")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    given = os.environ.get("TIDEGATE_JOURNEY_INSTALL")
    if given:
        inst = Install(Path(given))
        if not (inst.root / "installed.json").exists():
            pytest.fail(f"TIDEGATE_JOURNEY_INSTALL={given} holds no finished install "
                        "(python tests/journey/install.py DEST makes one)", pytrace=False)
        return inst
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this run (one build, under a lock)
    return ensure_install(base / "journey-install")


@pytest.fixture
def operator(install: Install, tmp_path: Path):
    """An operator with an empty private ``HOME``; what it left running is stopped."""
    home = tmp_path / "home"
    home.mkdir()
    op = Operator(install, home)
    yield op
    op.cleanup()


@pytest.fixture
def telegram():
    """The fake Telegram Bot API in a thread (``.url``, ``.fake``, ``.call(fn, ...)``)."""
    from tests.fakes.fake_telegram import start_in_thread
    handle = start_in_thread()
    yield handle
    handle.stop()


@pytest.fixture
def model():
    """The fake OpenAI-compatible model in a thread (``.base_url``, ``.server``); it
    answers ``echo: <last user text>`` unless a test scripts it."""
    from tests.fakes.fake_openai import FakeOpenAI
    running = FakeOpenAI.start_in_thread()
    yield running
    running.stop()
