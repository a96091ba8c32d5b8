"""An orderly stop is not a crash (docs/outcomes.md "Dead letters"): a real ``tidegate
gateway`` process whose one turn waits on a slow model, stopped with SIGTERM three times
(an operator restarting it during one long turn) and started again, answers the message;
before, each stop was charged to the turn like a death and the third set the user's
message aside. Killed with SIGKILL the same three times, it still dead-letters it (a turn
alone in the process when it dies is charged). Both storages: the intake journal (a
``stop`` record per attempt cut off) and PostgreSQL (the rows' attempt closed at
``leave``)."""

from __future__ import annotations

import pytest

from gateway.journal.dead_letters import DEAD_LETTER_NOTICE
from tests.channel_harness import chat_requests
from tests.fakes import fake_telegram
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import GatewayProcess, base_config
from tests.test_gateway_channels import wait

pytestmark = [pytest.mark.timeout(60),
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
            outcomes = gp.cli("sessions", "outcomes").stdout
            assert "replied" in outcomes and "dead-lettered" not in outcomes
        else:
            wait(lambda: texts(tg) == [DEAD_LETTER_NOTICE], what="the dead-letter notice")
            assert len(chat_requests(model.server)) == 3
    finally:
        assert gp.stop() == 0
    listed = gp.cli("channels", "dead-letters", "list").stdout
    assert ("a long job" in listed) == (how == "sigkill"), listed
