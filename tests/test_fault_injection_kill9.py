"""The outcome rule end to end under real faults (docs/outcomes.md; tests/fault_injection/):
one ``tidegate gateway`` process on a real PostgreSQL, 200 messages over Telegram, Slack,
Discord, the OpenAI-compatible endpoint and webchat while the gateway is killed with
SIGKILL (at a random instant, and three times more by a poison message whose tool takes
the process down, each time with other turns in flight) and started again, PostgreSQL is
stopped for 5 s and the model answers 500, 429 or nothing for a while. Afterwards, read
from outside (the fakes' chats, ``tidegate sessions outcomes``, ``tidegate channels
dead-letters list``, ``status``, ``/metrics``): every accepted message has exactly one
outcome, no chat shows a reply twice, the dead letters are exactly the poison message,
and nothing is counted as left without an outcome. Seeded: a failure prints the seed and
``bench/fault_injection.py --seed S`` replays the plan (longer runs live there)."""

from __future__ import annotations

import pytest

from tests.fault_injection.run import report, run

pytestmark = [pytest.mark.timeout(420),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

SEED = 4


def test_200_messages_under_kill9_a_postgres_stop_model_failures_and_a_poison(tmp_path):
    r = run(seed=SEED, messages=200, duration=8, kills=1, pg_stops=1, model_windows=3,
            settle=180, tmp=tmp_path, log=lambda *_: None)
    started = {f.kind for f in r.faults if f.start}
    assert started == {"kill", "pg", "500", "429", "hang"}, report(r)
    assert r.deaths >= 3  # the poison took the gateway down 3 times
    assert r.anomalies == {}, f"seed {SEED}:\n{report(r)}"
    outcomes = {row.get("outcome") for row in r.observed.outcomes}
    assert {"replied", "dead-lettered"} <= outcomes, report(r)
