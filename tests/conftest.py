"""Shared fixtures: a real PostgreSQL server for the storage tests (tests/pg_server.py).

``pg_server`` starts once per test session, lazily (only sessions that use it pay the
~2 s initdb); ``pg_dsn`` is a fresh, empty database for one test. A missing PostgreSQL
is a test failure, never a skip.
"""

from __future__ import annotations

import pytest

from tests.pg_server import PgMissing, PgServer, start_server


def pytest_configure(config):
    """Tests start with the product's unconfigured logging (WARNING and above to stderr),
    not structlog's default PrintLogger, which prints every event to whatever sys.stdout
    is at that instant: a capture file, or a CLI thread's redirected buffer."""
    from gateway.logs.pipeline import reset_logging
    reset_logging()


@pytest.fixture(autouse=True)
def _unconfigured_logging_after(request):
    """Every test leaves logging unconfigured: a one-shot command run in-process (level
    warning) or a gateway's configuration must not filter the next test's log capture."""
    yield
    if "journey" not in request.node.path.parts:
        from gateway.logs.pipeline import reset_logging
        reset_logging()


@pytest.fixture(autouse=True)
def _reap_gateways(request):
    """Kill the gateway subprocesses a test started and left running: a test stopped by
    its timeout or a failed assertion never leaks a gateway into later tests. The journey
    tests (tests/journey/) import nothing of the product and clean up after themselves."""
    if "journey" in request.node.path.parts:
        yield
        return
    from tests.helpers import GatewayProcess
    before = set(GatewayProcess.live)
    yield
    for gw in GatewayProcess.live - before:
        if gw.proc is not None and gw.proc.poll() is None:
            print(f"killing a gateway the test left running (pid {gw.proc.pid})")
        gw.kill9()


@pytest.fixture(scope="session")
def pg_server():
    try:
        server = start_server()
    except PgMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.destroy()


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> str:
    """DSN of a fresh, empty database on the session's server."""
    return pg_server.create_database()


@pytest.fixture(params=["embedded", "postgres"])
async def backend(request, tmp_path):
    """Each storage backend in turn (tests/storage_backends.py); the PostgreSQL one on a
    fresh database."""
    from tests.storage_backends import EmbeddedBackend, PostgresBackend
    if request.param == "embedded":
        b = EmbeddedBackend(tmp_path)
    else:
        b = PostgresBackend(request.getfixturevalue("pg_dsn"))
        b.tmp = tmp_path  # files a PostgreSQL store does not use (left empty)
    yield b
    await b.close()


@pytest.fixture
def fake_model():
    """A fake OpenAI-compatible model server in a thread (tests/fakes/fake_openai.py);
    test modules that define their own ``fake_model`` keep theirs."""
    from tests.fakes.fake_openai import FakeOpenAI
    running = FakeOpenAI.start_in_thread()
    yield running
    running.stop()


# The fake platforms and the fake model, one per test (tests/fakes/). A test module that
# defines a fixture of the same name keeps its own.

@pytest.fixture
async def model():
    """The fake OpenAI-compatible model on a free port (tests/fakes/fake_openai.py)."""
    from tests.fakes.fake_openai import FakeOpenAI
    async with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
async def tg():
    """The fake Telegram Bot API (tests/fakes/fake_telegram.py)."""
    from tests.fakes.fake_telegram import FakeTelegram
    fake = await FakeTelegram().start()
    yield fake
    await fake.stop()


@pytest.fixture
async def slack():
    """The fake Slack Web API and Socket Mode server (tests/fakes/fake_slack/)."""
    from tests.fakes.fake_slack import FakeSlack
    fake = await FakeSlack().start()
    yield fake
    await fake.stop()


@pytest.fixture
async def dc():
    """The fake Discord REST API and gateway (tests/fakes/fake_discord/)."""
    from tests.fakes.fake_discord import FakeDiscord
    fake = FakeDiscord()
    await fake.start()
    yield fake
    await fake.stop()
