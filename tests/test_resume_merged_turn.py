"""Messages that shared one turn when the process died (steered into it, or merged by
``collect``: their journal entries share the turn's run id) are resumed as that one turn:
one restart notice, one model turn, one reply, and one outcome for each message. Before,
each entry was resumed on its own: the user got the restart notice twice and two turns
answered, the second one (its message already answered in the transcript by the first)
delivering the same reply again (docs/agents.md: "a crash resumes it with the turn and
never answers it twice")."""

from __future__ import annotations

import pytest

from gateway.journal.resume import INTERRUPTED_NOTICE
from gateway.journal.store import FILE_NAME as JOURNAL_FILE
from gateway.journal.store import IntakeJournal
from gateway.journal.tracking import work_to_dict
from gateway.routing import Route
from gateway.turns.work import UserWork
from runtime.clock import SYSTEM_CLOCK
from tests.channel_harness import chat_requests, until
from tests.helpers import base_config, running_gateway
from tests.test_outcomes import done_records

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER = 5151
KEY = f"agent:main:telegram:dm:{USER}"


def _config(tmp_path, model, tg, mode: str) -> dict:
    return base_config(tmp_path / "state", model.base_url, channels={"telegram": {
        "enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
        "poll_timeout": 1, "dm_policy": "open"}},
        messages={"queue": {"mode": mode, "debounce": 0}})


def _died_in_one_turn(state, tools: list[str]) -> list[str]:
    """The journal a process leaves when it died in the turn that took two messages (the
    second steered in after ``tools`` began)."""
    journal = IntakeJournal(state / JOURNAL_FILE, SYSTEM_CLOCK)
    journal.load()
    ids = []
    for n, text in enumerate(("start the build", "and tell me when done")):
        work = UserWork(agent_id="main", text=text, channel="telegram",
                        message_id=f"m{n}", sender_id=str(USER),
                        route=Route("telegram", str(USER)))
        ids.append(journal.accept(KEY, work_to_dict(work), f"telegram:default:{n}").id)
    journal.started(ids[:1], "run-dead")
    for tool in tools:
        journal.tool_began("run-dead", tool)
    journal.started(ids[1:], "run-dead")  # steered in
    journal.close()
    return ids


@pytest.mark.parametrize("mode,tools", [("steer", ["exec"]), ("followup", [])])
async def test_messages_of_one_turn_are_resumed_as_that_turn(tmp_path, model, tg, mode,
                                                            tools):
    state = tmp_path / "state"
    cfg = _config(tmp_path, model, tg, mode)
    ids = _died_in_one_turn(state, tools)
    model.script_text("Build done.")
    model.script_text("A SECOND ANSWER")
    async with running_gateway(cfg) as gw:
        await until(lambda: len(gw.journal.outcomes) == 2, what="both outcomes")
        await until(lambda: not gw.lanes.is_running(KEY), what="the lane to idle")
        assert gw.status()["outcomes"]["unresolved"] == 0
        sid = gw.agents["main"].store.get(KEY).session_id
        events = await gw.timeline_hooks.timeline.get_timeline(sid)
    # one row and one OUTCOME event each, with the message's own id
    assert sorted(e.content["message_id"] for e in events
                  if e.event_type == "OUTCOME") == ["m0", "m1"]
    assert {r["id"]: r["message_id"] for r in done_records(state)} == {
        ids[0]: "m0", ids[1]: "m1"}
    texts = [m["text"] for m in tg.bot_messages(USER)]
    notice = [INTERRUPTED_NOTICE] if tools else []
    assert texts == [*notice, "Build done."], texts
    assert len(chat_requests(model)) == 1
    rows = {r["id"]: r["outcome"] for r in done_records(state)}
    want = "interrupted" if tools else "replied"
    assert rows == dict.fromkeys(ids, want)
