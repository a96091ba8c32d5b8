"""Whom a death of the process is charged to with embedded storage (the intake journal
file; docs/outcomes.md "Dead letters"): the bystander rule the PostgreSQL rows follow
(gateway/cluster/crashes.py) applied at each load of the journal
(gateway/journal/store.py ``_account_death``, gateway/journal/outcomes.py ``charged``).

Each "life" below is what one gateway process leaves in the file before it is killed:
the journal is loaded (the previous death accounted), the unfinished turns start again,
and the process dies (the file is closed without any ``done``)."""

from __future__ import annotations

from gateway.journal import dead_letters
from gateway.journal.store import FILE_NAME, IntakeJournal
from runtime.clock import FakeClock


def life(path, turns: list[tuple[list[str], list[str]]]) -> dict[str, object]:
    """Load the journal, start ``turns`` (``(entry ids, side-effecting tools begun)``,
    one run each), die. Returns the loaded entries by id (before the new starts)."""
    journal = IntakeJournal(path, FakeClock(1_000.0), fsync=False)
    loaded = {e.id: e for e in journal.load()}
    for n, (ids, tools) in enumerate(turns):
        run = f"run-{len(path.read_bytes())}-{n}"  # a fresh run id per life
        journal.started(ids, run)
        for tool in tools:
            journal.tool_began(run, tool)
    journal.close()
    return loaded


def accept(path, *keys: str) -> list[str]:
    journal = IntakeJournal(path, FakeClock(1_000.0), fsync=False)
    journal.load()
    ids = [journal.accept(k, {"agent_id": "main", "text": k, "channel": "telegram"}).id
           for k in keys]
    journal.close()
    return ids


def test_a_death_with_several_turns_in_the_model_is_charged_to_none(tmp_path):
    path = tmp_path / FILE_NAME
    a, b, c = accept(path, "k:a", "k:b", "k:c")
    for _ in range(4):  # four kills, each with the three turns waiting on the model
        life(path, [([a], []), ([b], []), ([c], [])])
    entries = life(path, [])
    assert [entries[i].crashes for i in (a, b, c)] == [[], [], []]
    assert not any(dead_letters.due(entries[i]) for i in (a, b, c))


def test_a_turn_dying_in_a_tool_3_times_is_dead_lettered_and_its_bystander_is_not(tmp_path):
    path = tmp_path / FILE_NAME
    poison, bystander = accept(path, "k:poison", "k:other")
    for _ in range(3):
        life(path, [([poison], ["exec"]), ([bystander], [])])
    entries = life(path, [])
    assert entries[poison].crashes == ["tool:exec"] * 3 and dead_letters.due(entries[poison])
    assert entries[bystander].crashes == [] and not dead_letters.due(entries[bystander])


def test_a_turn_dying_alone_is_charged_once_per_death(tmp_path):
    path = tmp_path / FILE_NAME
    merged = accept(path, "k:m", "k:m")  # two messages merged into one turn: one turn
    life(path, [(merged, [])])
    life(path, [])  # the next life died before the turn started again: not charged
    entries = life(path, [(merged, [])])
    assert [entries[i].crashes for i in merged] == [["turn"], ["turn"]]
    life(path, [(merged, [])])
    entries = life(path, [])
    assert all(entries[i].crashes == ["turn"] * 3 and dead_letters.due(entries[i])
               for i in merged)


def test_an_orderly_stop_settles_the_attempts_it_cut_off_without_a_charge(tmp_path):
    """``stopped`` (the daemon's stop, after the lanes drained) writes a ``stop`` record
    per attempt still open: the next load charges none of them, even one turn alone, and
    compaction keeps that (the start record is written settled)."""
    path = tmp_path / FILE_NAME
    [alone] = accept(path, "k:alone")
    for _ in range(3):
        journal = IntakeJournal(path, FakeClock(1_000.0), fsync=False)
        journal.load()
        journal.started([alone], f"run-{len(path.read_bytes())}")
        assert journal.stopped() == [alone] and journal.stopped() == []
        journal.close()
    journal = IntakeJournal(path, FakeClock(1_000.0), fsync=False, compact_after=1)
    [entry] = journal.load()  # (compacted: more lines than the live entry needs)
    assert entry.crashes == [] and entry.settled and not dead_letters.due(entry)
    journal.close()
    entries = life(path, [([alone], [])])  # then one death alone: charged as before
    assert entries[alone].crashes == []
    assert life(path, [])[alone].crashes == ["turn"]
