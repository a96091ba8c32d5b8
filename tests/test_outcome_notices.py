"""A turn that raised tells its chat once: the messages it answered (merged by
``collect``, steered in) each end ``failed``, but the user gets one "something went
wrong" notice, not one per message. Two turns that raised each send theirs."""

from __future__ import annotations

import asyncio

from gateway.journal.recorder import FAILED_NOTICE, OutcomeRecorder
from gateway.journal.store import FILE_NAME, IntakeJournal
from gateway.routing import Route
from gateway.turns.work import UserWork
from runtime.clock import FakeClock

KEY = "agent:main:telegram:dm:77"


async def test_a_turn_that_raised_sends_one_notice_for_all_its_messages(tmp_path):
    clock = FakeClock()
    journal = IntakeJournal(tmp_path / FILE_NAME, clock, fsync=False)
    journal.load()
    notices: list = []

    async def notify(route, text, key):
        notices.append((route.to, text))
    rec = OutcomeRecorder(clock, journal, notify=notify)
    loop = asyncio.get_running_loop()
    works, futs = [], []
    for text in ("first", "steered in", "next turn"):
        w = UserWork(agent_id="main", text=text, channel="telegram",
                     route=Route("telegram", "77"), message_id=text)
        w.journal_id = journal.accept(KEY, {"agent_id": "main", "text": text}).id
        fut = loop.create_future()
        rec.watch(w, KEY, fut)
        works.append(w)
        futs.append(fut)
    bug = RuntimeError("bug in a tool wrapper")
    for fut in futs[:2]:  # the lane settles every message of the turn with its error
        fut.set_exception(bug)
    futs[2].set_exception(RuntimeError("another turn's bug"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert [w.outcome for w in works] == ["failed"] * 3
    assert notices == [("77", FAILED_NOTICE)] * 2  # one for each turn, not per message
    journal.close()
