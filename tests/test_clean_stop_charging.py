"""An orderly stop is not a crash (docs/outcomes.md "Dead letters"): a real ``tidegate
gateway`` process whose one turn waits on a slow model, stopped with SIGTERM three times
(an operator restarting it during one long turn) and started again, answers the message;
before, each stop was charged to the turn like a death and the third set the user's
message aside. Killed with SIGKILL the same three times, it still dead-letters it (a turn
alone in the process when it dies is charged). Both storages: the intake journal (a
``stop`` record per attempt cut off) and PostgreSQL (the rows' attempt closed at
``leave``).

Four gateway starts, and nearly all of a run is them (1.7 s of CPU each, measured): a
run takes 10-20 s on a quiet machine and about 150 s when its 2 cores carry a load of 12
(each start 30-35 s), hence the timeout; a hang still ends sooner, at a start's own 60 s
or a wait's 15 s. The outcomes and dead letters are read over the control API, not by
two more CLI processes."""

from __future__ import annotations

import json
import urllib.request

import pytest

from gateway.journal.dead_letters import DEAD_LETTER_NOTICE
from tests.channel_harness import chat_requests
from tests.fakes import fake_telegram
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess, base_config
from tests.test_gateway_channels import wait

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER = 5151


@pytest.fixture
def fakes():
    model, tg = FakeOpenAI.start_in_thread(), fake_telegram.start_in_thread()
    yield model, tg
    tg.stop()
    model.stop()


def config(tmp_path, model, tg, storage: str, request) -> dict:
    cfg = base_config(tmp_path / "state", model.base_url,
                      gateway={"shutdown_grace": "0.1s"},
                      channels={"telegram": {"enabled": True, "token": tg.fake.token,
                                             "api_base_url": f"{tg.url}/bot",
                                             "poll_timeout": 1, "dm_policy": "open",
                                             "streaming": "off"}})
    if storage == "postgres":
        cfg["storage"] = {"backend": "postgres",
                          "dsn": request.getfixturevalue("pg_dsn")}
        cfg["cluster"] = {"replica_id": "r0",  # restarted as itself, as under systemd
                          "lease_ttl": "2s"}  # its takeover tick: every 0.4 s
    return cfg


def api(gp, path: str):
    """GET ``path`` of the running gateway's control API (its token), parsed."""
    req = urllib.request.Request(f"http://127.0.0.1:{gp.port}{path}",
                                 headers={"Authorization": f"Bearer {gp.token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def texts(tg) -> list[str]:
    return [m["text"] for m in tg.call(tg.fake.bot_messages, USER)]


@pytest.mark.parametrize("storage", ["embedded", "postgres"])
@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_three_stops_during_one_long_turn_answer_it_three_kills_set_it_aside(
        tmp_path, fakes, storage, how, request):
    model, tg = fakes
    gp = GatewayProcess(tmp_path, config(tmp_path, model, tg, storage, request))
    for life in range(3):
        model.server.script_hang()  # the turn waits on the model until the process ends
        gp.start()
        if life == 0:
            tg.call(tg.fake.inject_message, "a long job", chat_id=USER, user_id=USER)
        wait(lambda n=life + 1: len(chat_requests(model.server)) == n,
             what=f"model call {life + 1}")
        if how == "sigterm":
            assert gp.stop() == 0
        else:
            gp.kill9()
    model.server.script_text("Done at last")
    gp.start()
    try:
        if how == "sigterm":
            wait(lambda: texts(tg) == ["Done at last"], what="the reply")
            assert len(chat_requests(model.server)) == 4
        else:
            wait(lambda: texts(tg) == [DEAD_LETTER_NOTICE], what="the dead-letter notice")
            assert len(chat_requests(model.server)) == 3
        outcomes = [r["outcome"] for r in api(gp, "/api/outcomes")["outcomes"]]
        listed = [d["text"] for d in api(gp, "/api/dead-letters")["dead_letters"]]
    finally:
        assert gp.stop() == 0
    if how == "sigterm":
        assert outcomes == ["replied"] and listed == [], (outcomes, listed)
    else:
        assert outcomes == ["dead-lettered"] and listed == ["a long job"], (outcomes, listed)
