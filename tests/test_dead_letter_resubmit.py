"""``dead-letters resubmit`` accepts a dead letter again exactly once: two resubmits of
the same dead letter at once (a double click in the control UI, the CLI run twice) make
one new journal entry and one turn, not two turns that both answer the user. The dead
letter is claimed before the new entry is made durable (the await where the second
resubmit used to find it still listed)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from gateway.journal import dead_letters
from gateway.journal.recorder import OutcomeRecorder
from gateway.journal.store import FILE_NAME, IntakeJournal
from gateway.journal.tracking import work_to_dict
from gateway.turns.work import UserWork
from runtime.clock import FakeClock

KEY = "agent:main:telegram:dm:9"


class _Lanes:
    def __init__(self) -> None:
        self.submitted: list = []

    def submit(self, key, work, **kw):
        self.submitted.append((key, work))
        return asyncio.get_running_loop().create_future()


async def test_two_resubmits_of_one_dead_letter_run_it_once(tmp_path):
    clock = FakeClock(1_000.0)
    journal = IntakeJournal(tmp_path / FILE_NAME, clock, fsync=True)  # durable() awaits
    journal.load()
    rec = OutcomeRecorder(clock, journal)
    work = UserWork(agent_id="main", text="poison", channel="telegram", message_id="p1")
    entry = journal.accept(KEY, work_to_dict(work))
    rec.record_message({"journal_id": entry.id, "channel": "telegram", "agent": "main",
                        "work": work_to_dict(work), "crashes": ["tool:exec"] * 3},
                       "dead-lettered", "set aside", session_key=KEY)
    lanes = _Lanes()
    gw = SimpleNamespace(journal=journal, lanes=lanes, outcomes=rec)
    try:
        got = await asyncio.gather(dead_letters.resubmit(gw, entry.id),
                                   dead_letters.resubmit(gw, entry.id))
        assert got.count(None) == 1, got
        assert len(lanes.submitted) == 1
        assert [e.work["text"] for e in journal.unfinished()] == ["poison"]
        assert dead_letters.listing(journal) == []
    finally:
        journal.close()
