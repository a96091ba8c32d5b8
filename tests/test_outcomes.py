"""Every accepted message ends in exactly one recorded outcome (docs/outcomes.md): the
journal's done record carries it, the session's timeline has an OUTCOME event, the
operator lists it (``tidegate sessions outcomes``), and status counts the messages that
have none."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.journal.outcomes import read_rows
from gateway.journal.recorder import OutcomeRecorder, turn_outcome
from gateway.journal.store import FILE_NAME as JOURNAL_FILE
from gateway.journal.store import IntakeJournal
from runtime.clock import FakeClock
from runtime.turn import TurnResult
from tests.channel_harness import chat_requests, run_cli, until, write_config
from tests.fakes.fake_openai import StreamGate
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER = 4242
KEY = f"agent:main:telegram:dm:{USER}"


def tg_config(tmp_path, model, tg) -> dict:
    return base_config(tmp_path / "state", model.base_url, channels={"telegram": {
        "enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
        "poll_timeout": 1, "dm_policy": "open"}})


def done_records(state) -> list[dict]:
    lines = (state / JOURNAL_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["op"] == "done" and r.get("outcome")]


async def test_each_message_ends_in_one_outcome_on_disk_in_the_timeline_and_the_list(
        tmp_path, model, tg):
    cfg = tg_config(tmp_path, model, tg)
    state = tmp_path / "state"
    path = write_config(tmp_path, cfg)
    async with running_gateway(cfg) as gw:
        model.script_text("Hi there")
        tg.inject_message("hello", chat_id=USER, user_id=USER)
        await until(lambda: len(gw.journal.outcomes) == 1, what="the first outcome")
        model.script_text("NO_REPLY")
        tg.inject_message("just saying", chat_id=USER, user_id=USER)
        await until(lambda: len(gw.journal.outcomes) == 2, what="the silent outcome")
        model.script_error(500, message="upstream down")
        tg.inject_message("break", chat_id=USER, user_id=USER)
        await until(lambda: len(gw.journal.outcomes) == 3, what="the failed outcome")
        await gw.local.send("from the cli")
        status = gw.status()["outcomes"]
        assert status["unresolved"] == 0 and status["dead_letters"] == 0
        assert status["counts"] == {"replied": 2, "silent": 1, "failed": 1}
        code, out, err = await run_cli(path, "sessions", "outcomes", KEY)
        assert code == 0, err
        assert [line.split()[1] for line in out.splitlines()] == [
            "replied", "silent", "failed"]
        session_id = gw.agents["main"].store.get(KEY).session_id
        await gw.timeline_hooks.flush()
        events = await gw.timeline_hooks.timeline.get_timeline(session_id)
    sent = [m["text"] for m in tg.bot_messages(USER)]
    assert sent[0] == "Hi there" and len(sent) == 2  # the failure's notice, no silent reply
    rows = done_records(state)
    assert [(r["outcome"], r["session_key"]) for r in rows[:3]] == [
        ("replied", KEY), ("silent", KEY), ("failed", KEY)]
    assert "upstream down" in rows[2]["detail"]
    assert rows[3]["outcome"] == "replied" and rows[3]["local"] is True
    outcome_events = [e.content for e in events if e.event_type == "OUTCOME"]
    assert [c["outcome"] for c in outcome_events] == ["replied", "silent", "failed"]
    assert [c["entry_id"] for c in outcome_events] == [r["id"] for r in rows[:3]]
    # without the gateway the list is read from the journal file
    code, out, _ = await run_cli(path, "sessions", "outcomes", "--json")
    assert [r["outcome"] for r in json.loads(out)] == ["replied", "silent", "failed",
                                                       "replied"]


def test_unresolved_counts_accepted_messages_older_than_the_turn_timeout(tmp_path):
    clock = FakeClock()
    journal = IntakeJournal(tmp_path / JOURNAL_FILE, clock, fsync=False)
    journal.load()
    rec = OutcomeRecorder(clock, journal)
    entry = journal.accept(KEY, {"agent_id": "main", "text": "hi", "channel": "telegram"})
    held = journal.accept(KEY, {"gated": {"text": "album part"}})  # waits for a mention
    clock.set_wall(clock.time() + 599)
    assert rec.unresolved(lambda e: 600.0) == 0
    clock.set_wall(clock.time() + 2)
    assert rec.unresolved(lambda e: 600.0) == 1
    rec.record_message({"journal_id": entry.id, "channel": "telegram"}, "replied",
                       session_key=KEY)
    assert rec.unresolved(lambda e: 600.0) == 0
    assert journal.get(held.id) is not None
    with pytest.raises(ValueError, match="unknown outcome 'answered'"):
        rec.record_message({}, "answered", session_key=KEY)
    journal.close()


def _long_turn_then_one_more(tmp_path, model, tg):
    """A FakeClock, the gate holding the first turn's answer, and the config (45 s turn
    timeout): the first message's turn runs until the gate opens, the next one queues."""
    gate = StreamGate()
    model.push({"type": "text", "text": "a long answer", "gate": gate})
    model.script_text("the queued answer")
    cfg = tg_config(tmp_path, model, tg)
    cfg["agents"]["defaults"]["timeout"] = "45s"
    cfg["gateway"]["shutdown_grace"] = "0s"
    return FakeClock(), gate, cfg


async def test_a_message_waiting_behind_a_long_turn_is_not_unresolved(tmp_path, model, tg):
    """A message queued behind a running turn (or in it) is on its way, however old; one
    that no lane holds (lost) is counted once older than the turn timeout."""
    clock, gate, cfg = _long_turn_then_one_more(tmp_path, model, tg)
    async with running_gateway(cfg, clock=clock) as gw:
        tg.inject_message("long one", chat_id=USER, user_id=USER)
        await until(lambda: len(chat_requests(model)) == 1, what="the long turn")
        tg.inject_message("queued behind", chat_id=USER, user_id=USER)
        await until(lambda: gw.lanes.stats()["queued"] == 1, what="the queued message")
        assert len(gw.journal.unfinished()) == 2
        clock.set_wall(clock.time() + 60)  # both older than the turn timeout
        assert gw.status()["outcomes"]["unresolved"] == 0
        lost = gw.journal.accept(KEY, {"agent_id": "main", "text": "lost",
                                       "channel": "telegram"})  # in no lane
        clock.set_wall(clock.time() + 46)
        assert gw.status()["outcomes"]["unresolved"] == 1
        gate.open()
        for _ in range(20):  # the drafts' throttle (the clock), then both replies
            if len(gw.journal.unfinished()) == 1:
                break
            await clock.advance(1.0)
            await asyncio.sleep(0.05)
        await until(lambda: len(gw.journal.unfinished()) == 1, what="both answered")
        assert [e.id for e in gw.journal.unfinished()] == [lost.id]
        assert gw.status()["outcomes"]["unresolved"] == 1
        gw.outcomes.record_message({"journal_id": lost.id}, "failed", session_key=KEY)
        assert gw.status()["outcomes"]["unresolved"] == 0


@pytest.mark.parametrize(("status", "delivery", "local", "resume", "expected"), [
    ("ok", "delivered", False, None, ("replied", "")),
    ("ok", "queued", False, None, ("replied", "queued")),
    ("ok", "silent", False, None, ("silent", "")),
    ("ok", "none", True, None, ("replied", "")),
    ("ok", "tool", False, None, ("replied", "sent with the message tool")),
    ("refused", "delivered", False, None, ("refused", "daily budget used up")),
    ("timeout", "delivered", False, None, ("failed", "daily budget used up")),
    ("ok", "failed: chat not found", False, None,
     ("failed", "the reply was not delivered (chat not found)")),
    ("ok", "delivered", False, "rerun", ("replied", "re-run after a restart")),
])
def test_turn_outcome_names_how_the_turn_ended(status, delivery, local, resume, expected):
    result = TurnResult("r", KEY, "s", status, "NO_REPLY" if delivery == "silent" else "ok",
                        error="daily budget used up" if status != "ok" else None)
    assert turn_outcome(result, delivery, local=local, resume=resume) == expected


def test_continued_turn_is_interrupted_with_what_ran():
    result = TurnResult("r", KEY, "s", "ok", "done")
    outcome, detail = turn_outcome(result, "delivered", local=False, resume="continue",
                                   tools=["write", "exec", "write"])
    assert outcome == "interrupted"
    assert "write, exec had run" in detail and "ended replied" in detail


def test_rows_and_dead_letters_survive_compaction_and_reopening(tmp_path):
    clock = FakeClock()
    path = tmp_path / JOURNAL_FILE
    journal = IntakeJournal(path, clock, fsync=False, compact_after=50, kept=20)
    journal.load()
    for i in range(60):
        e = journal.accept(KEY, {"agent_id": "main", "text": f"m{i}", "channel": "telegram",
                                 "message_id": str(i)})
        journal.done(e.id, {"outcome": "replied", "detail": ""})
    dead = journal.accept(KEY, {"agent_id": "main", "text": "poison", "channel": "telegram"})
    journal.done(dead.id, {"outcome": "dead-lettered", "detail": "x",
                           "work": dead.work, "crashes": ["turn", "turn", "turn"]})
    for i in range(30):  # the dead letter's row outlives newer rows
        e = journal.accept(KEY, {"agent_id": "main", "text": f"n{i}", "channel": "telegram"})
        journal.done(e.id, {"outcome": "silent", "detail": ""})
    assert journal.compactions >= 2
    journal.close()
    assert len(path.read_text().splitlines()) < 200
    for rows in (read_rows(path, kept=20), _reopened(path, clock).outcomes):
        assert len(rows) == 20
        assert list(rows.dead) == [dead.id]
        assert rows.dead[dead.id]["work"]["text"] == "poison"
        assert rows.select(KEY, limit=1)[0]["outcome"] == "silent"


def _reopened(path, clock) -> IntakeJournal:
    j = IntakeJournal(path, clock, fsync=False, kept=20)
    j.load()
    j.close()
    return j


async def test_a_turn_that_raised_ends_failed_and_the_user_gets_a_notice(tmp_path):
    import asyncio

    from gateway.routing import Route
    from gateway.turns.work import UserWork
    from runtime.lanes import TurnInterrupted
    clock = FakeClock()
    journal = IntakeJournal(tmp_path / JOURNAL_FILE, clock, fsync=False)
    journal.load()
    notices = []

    async def notify(route, text, key):
        notices.append((route.to, text, key))
    rec = OutcomeRecorder(clock, journal, notify=notify)
    loop = asyncio.get_running_loop()
    works, futs = [], []
    for text in ("raises", "interrupted", "stopped at shutdown"):
        w = UserWork(agent_id="main", text=text, channel="telegram", route=Route(
            "telegram", str(USER)), message_id=text)
        w.journal_id = journal.accept(KEY, {"agent_id": "main", "text": text}).id
        fut = loop.create_future()
        rec.watch(w, KEY, fut)
        works.append(w)
        futs.append(fut)
    futs[0].set_exception(RuntimeError("bug in a tool wrapper"))
    futs[1].set_result(TurnInterrupted())
    futs[2].cancel()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [w.outcome for w in works] == ["failed", "interrupted", None]
    assert [e.work["text"] for e in journal.unfinished()] == ["stopped at shutdown"]
    assert notices and "something went wrong" in notices[0][1]
    assert "bug in a tool wrapper" in rec.journal.outcomes.select()[0]["detail"]
    journal.close()


# -- dead letters ---------------------------------------------------------------------------

def crashed(journal, key: str, user: int, text: str, attempts: list[list[str]]) -> str:
    """The journal lines the process leaves when it died during each attempt of the
    message's turn (``attempts``: the side-effecting tools each one began)."""
    from gateway.journal.tracking import work_to_dict
    from gateway.routing import Route
    from gateway.turns.work import UserWork
    work = UserWork(agent_id="main", text=text, channel="telegram", message_id=text,
                    route=Route("telegram", str(user)))
    entry = journal.accept(key, work_to_dict(work))
    for n, tools in enumerate(attempts):
        journal.started([entry.id], f"{entry.id}-{n}")
        for tool in tools:
            journal.tool_began(f"{entry.id}-{n}", tool)
    return entry.id


async def test_a_message_the_gateway_died_on_3_times_the_same_way_is_set_aside(
        tmp_path, model, tg):
    from gateway.journal.dead_letters import DEAD_LETTER_NOTICE
    from gateway.journal.resume import INTERRUPTED_NOTICE
    from runtime.clock import SYSTEM_CLOCK
    from tests.channel_harness import chat_requests
    state = tmp_path / "state"
    cfg = tg_config(tmp_path, model, tg)
    path = write_config(tmp_path, cfg)
    journal = IntakeJournal(state / JOURNAL_FILE, SYSTEM_CLOCK)
    journal.load()
    third = f"agent:main:telegram:dm:{USER + 2}"  # died alone before any tool, 3 times
    dropped = crashed(journal, third, USER + 2, "bad", [[], [], []])
    journal.close()
    journal = IntakeJournal(state / JOURNAL_FILE, SYSTEM_CLOCK)
    journal.load()  # its third death is accounted: it was the one turn running
    poison = crashed(journal, KEY, USER, "poison", [["exec"], ["exec"], ["exec"]])
    other = f"agent:main:telegram:dm:{USER + 1}"  # died in different places: resumed
    crashed(journal, other, USER + 1, "unlucky", [["exec"], ["write"], ["exec"]])
    journal.close()
    model.script_text("Back on track")
    async with running_gateway(cfg) as gw:
        await until(lambda: tg.bot_messages(USER + 1)[1:], what="the resumed reply")
        assert gw.status()["outcomes"]["dead_letters"] == 2
        assert {d["id"] for d in gw.status()["outcomes"]["dead_letters_recent"]} == {
            poison, dropped}
        assert any(p.startswith(f"dead letter {poison} ({KEY})")  # the control UI's list
                   for p in gw.status()["problems"])
        code, out, err = await run_cli(path, "status")  # the human form says so too
        assert "outcomes: " in out and "; 0 without an outcome; 2 dead letters" in out, err
    assert [m["text"] for m in tg.bot_messages(USER)] == [DEAD_LETTER_NOTICE]
    assert [m["text"] for m in tg.bot_messages(USER + 1)] == [INTERRUPTED_NOTICE,
                                                              "Back on track"]
    assert len(chat_requests(model)) == 1  # the poison message never reached the model
    code, out, _ = await run_cli(path, "channels", "dead-letters", "list")
    assert code == 0 and poison in out and "tool:exec, tool:exec, tool:exec" in out
    async with running_gateway(cfg) as gw:  # the next start does not replay it
        assert len(chat_requests(model)) == 1
        code, out, _ = await run_cli(path, "channels", "dead-letters", "show", poison[:8])
        assert code == 0 and "text: poison" in out
        model.script_text("Poison handled")
        code, out, err = await run_cli(path, "channels", "dead-letters", "resubmit",
                                       poison[:6])  # a prefix names it; the answer says which
        assert code == 0 and out.startswith(f"resubmitted {poison} as "), err
        await until(lambda: len(tg.bot_messages(USER)) == 2, what="the resubmitted reply")
        code, out, err = await run_cli(path, "channels", "dead-letters", "drop", dropped[:6])
        assert code == 0 and out.strip() == f"dropped {dropped}", err
        assert gw.status()["outcomes"]["dead_letters"] == 0
        code, out, err = await run_cli(path, "channels", "dead-letters", "drop", poison)
        assert code == 1 and "no dead letter" in err
    assert tg.bot_messages(USER)[1]["text"] == "Poison handled"
    rows = [(r["outcome"], r["session_key"]) for r in done_records(state)]
    assert rows.count(("dead-lettered", KEY)) == 1 and rows[-1] == ("replied", KEY)
    assert ("interrupted", other) in rows and ("dead-lettered", third) in rows
    [bad] = [r for r in done_records(state) if r["session_key"] == third]
    assert "3 times during its turn, each time at turn" in bad["detail"]


def test_dead_letter_due_needs_the_same_failure_three_times_in_a_row():
    from gateway.journal.outcomes import dead_letter_due
    assert dead_letter_due(["turn", "turn"], "turn")
    assert not dead_letter_due(["turn"], "turn")
    assert not dead_letter_due(["tool:exec", "turn"], "turn")
    assert dead_letter_due(["turn", "tool:exec", "tool:exec"], "tool:exec")


async def test_a_secret_echoed_in_a_provider_error_is_stored_redacted(tmp_path, model, tg):
    """A 401 quoting the key it was sent: the outcome's detail in the journal, in
    ``tidegate sessions outcomes`` (the control API while running, the journal after)
    and in the timeline shows it redacted, as the log does."""
    key = "plain-provider-secret-4242"  # no token shape: only the configured set hides it
    cfg = tg_config(tmp_path, model, tg)
    cfg["models"]["providers"]["fake"]["api_key"] = key
    state = tmp_path / "state"
    path = write_config(tmp_path, cfg)
    async with running_gateway(cfg) as gw:
        model.script_error(401, message=f"Incorrect API key provided: {key}. Bearer "
                                        "sk-shaped0123456789abcdefgh")
        tg.inject_message("hello", chat_id=USER, user_id=USER)
        await until(lambda: len(gw.journal.outcomes) == 1, what="the failed outcome")
        code, out, err = await run_cli(path, "sessions", "outcomes", KEY, "--json")
        assert code == 0, err
        [row] = json.loads(out)
        assert row["outcome"] == "failed" and "Incorrect API key provided" in row["detail"]
        assert key not in out and "sk-shaped" not in out, out
    code, out, err = await run_cli(path, "sessions", "outcomes", KEY)
    assert code == 0 and "Incorrect API key" in out and key not in out, out
    for name in (JOURNAL_FILE, "timeline.db"):
        assert key.encode() not in (state / name).read_bytes(), name


async def test_a_local_message_waiting_behind_a_long_turn_is_not_unresolved(tmp_path, model,
                                                                            tg):
    """The same for a local message (CLI, webchat, the API): its journal record is held
    by the lane while it waits behind a long turn."""
    clock, gate, cfg = _long_turn_then_one_more(tmp_path, model, tg)
    async with running_gateway(cfg, clock=clock) as gw:
        first = gw.local.submit("long one", to="ann")
        await until(lambda: len(chat_requests(model)) == 1, what="the long turn")
        queued = gw.local.submit("queued behind", to="ann")
        await until(lambda: gw.lanes.stats()["queued"] == 1, what="the queued message")
        assert gw.journal.local_unfinished()  # the queued one is still open
        clock.set_wall(clock.time() + 60)  # both older than the turn timeout
        assert gw.status()["outcomes"]["unresolved"] == 0
        gate.open()
        await asyncio.wait_for(asyncio.gather(first.future, queued.future), 10)
        assert gw.status()["outcomes"]["unresolved"] == 0
