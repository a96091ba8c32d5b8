"""The randomized fault checker (tests/cluster_check/, bench/cluster_checker.py for long
runs): first the checker itself on hand-made histories (each anomaly kind is found, a
clean history passes), then one short seeded run of real replicas on a real PostgreSQL
with faults, which must come out without anomalies."""

from __future__ import annotations

import pytest

from tests.cluster_check import checker
from tests.cluster_check.cluster import key_of
from tests.cluster_check.generator import Op
from tests.cluster_check.model import Call
from tests.cluster_check.run import report, run

T = 1000.0  # the hand-made histories' start (epoch s)


def _history(ops, calls, *, chats=None, timelines=None, cron=(), every=0.0,
             verify=(0, "OK")) -> checker.History:
    return checker.History(ops=ops, calls=calls, faults=[], chats=chats or {},
                           timelines=timelines or [(key_of(0), "a")],
                           sessions=[(key_of(0), "a")], outcomes={}, cron_rows=list(cron),
                           cron_every=every, verify=verify, start=T, end=T + 60)


def _tg(i: int, at: float) -> Op:
    return Op(id=i, session=0, surface="telegram", replica="r1", at=0, sent=T + at,
              done=T + at, status="sent", tg_id=i)


def _echo(i: int, at: float) -> dict:
    return {"text": f"echo: chk s0 m{i}", "time": T + at}


def test_a_clean_history_has_no_anomalies():
    ops = [_tg(1, 0), _tg(2, 2)]
    calls = [Call("s0", [1], [1], T + 0.1, T + 0.2), Call("s0", [2], [1, 2], T + 2.1, T + 2.2)]
    h = _history(ops, calls, chats={9100: [_echo(1, 0.3), _echo(2, 2.3)]})
    assert checker.check(h) == {}


def test_each_anomaly_kind_is_found():
    ops = [_tg(1, 0), _tg(2, 0.05), _tg(3, 2), _tg(4, 3),
           Op(id=5, session=0, surface="openai", replica="r2", at=0, sent=T + 4,
              done=T + 4.2, status="ok", reply="echo: chk s0 m4")]
    calls = [Call("s0", [1], [1], T + 0.1, T + 0.5),
             Call("s0", [2], [2], T + 0.2, T + 0.6),  # overlaps m1 and lacks it later
             Call("s0", [3], [3], T + 2.1, T + 2.2),  # lost m1, m2
             Call("s0", [4], [4, 3], T + 3.1, T + 3.2),  # out of order
             Call("cron:j1", [], [], T + 10.1, T + 10.2),
             Call("cron:j1", [], [], T + 10.3, T + 10.4)]  # one occurrence run twice
    chats = {9100: [_echo(1, 0.6), _echo(2, 0.7), _echo(2, 0.8), _echo(3, 2.3),
                    _echo(5, 4.3)]}  # m2 twice, m4 never, m5 (openai) on Telegram
    h = _history(ops, calls, chats=chats, timelines=[(key_of(0), "a"), (key_of(0), "b")],
                 cron=[(T + 10, "done", 1), (T + 30, "running", 1)], every=5,
                 verify=(1, "BROKEN: chain"))
    found = checker.check(h)
    assert set(found) == {"overlapping-calls", "lost-history", "history-out-of-order",
                          "split-session", "duplicate-reply", "lost-reply", "wrong-reply",
                          "misrouted-reply", "cron-lost", "cron-unfinished", "cron-twice",
                          "timeline-verify"}
    assert found["lost-reply"] == ["m4 (telegram, s0, sent at 3.00s): no reply; outcomes []"]
    assert found["duplicate-reply"] == ["m2 (telegram, s0): 2 replies"]


def test_a_recorded_outcome_accounts_for_a_missing_reply():
    h = _history([_tg(1, 0)], [])
    assert "lost-reply" in checker.check(h)
    h.outcomes = {(key_of(0), "1"): ["failed"]}
    assert "lost-reply" not in checker.check(h)
    # "replied" says it arrived: none arrived, so lost; unless it was recorded as a send
    # a crash cut (unconfirmed: never resent, at most once)
    row = {"outcome": "replied", "detail": "reply resolved after a restart: unconfirmed"}
    h.outcomes = {(key_of(0), "1"): [checker.outcome_of({"outcome": "replied"})]}
    assert "lost-reply" in checker.check(h)
    h.outcomes = {(key_of(0), "1"): [checker.outcome_of(row)]}
    assert "lost-reply" not in checker.check(h) and checker.summary(h)["unconfirmed"] == 1


def test_real_time_order_is_checked():
    ops = [_tg(1, 0), _tg(2, 1.0)]  # m2 was sent after m1's reply arrived
    calls = [Call("s0", [2], [2], T + 1.1, T + 1.2), Call("s0", [1], [2, 1], T + 0.1, T + 0.2)]
    calls[0].start, calls[1].start = T + 0.05, T + 0.1  # ... yet reached the model first
    h = _history(ops, calls, chats={9100: [_echo(1, 0.5), _echo(2, 1.3)]})
    assert "real-time-order" in checker.check(h)


@pytest.mark.timeout(240)
@pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")
def test_two_replicas_under_a_seeded_fault_schedule_behave_as_one_gateway(tmp_path,
                                                                         pg_server):
    """Seed 39: 2 replicas on the session's PostgreSQL, 5 s of messages (15) to 3 sessions
    through Telegram, the OpenAI endpoint (plain and streamed) and ``agent -m`` on either
    replica; at 2 s a
    kill -9 of the busiest replica while its turns are in the model (it stays down: the
    other takes its account and lanes over); an isolated cron job every 2 s."""
    r = run(seed=39, duration=5, replicas=2, faults=["midturn"], sessions=3, rate=3.0,
            cron_every=2.0, settle=20, tmp=tmp_path, log=lambda *_: None, pg=pg_server,
            revive=False, first_fault=2.0, linger=1.0)
    assert [f.kind for f in r.history.faults if f.start] == ["midturn"]
    assert len(r.history.ops) == 15
    assert len([op for op in r.history.ops if op.status == "sent"]) == 8  # Telegram
    assert r.anomalies == {}, report(r, examples=5)


def test_a_cron_slot_skipped_while_the_previous_run_was_in_progress_is_not_lost():
    cron = [(T + 10, "done", 1), (T + 20, "done", 1)]  # the slot at 15 s has no row
    h = _history([], [], cron=cron, every=5)
    h.end = T + 22
    assert "cron-lost" in checker.check(h)
    h.cron_skipped = [T + 15]  # recorded skipped: the 10 s run was still in progress
    assert "cron-lost" not in checker.check(h)


def test_a_delayed_cron_call_counts_for_its_own_due_time_not_the_next():
    """Due 10 s ran late (its call at 16 s, after due 15 s ran at once elsewhere: it waited
    for the lane). By time alone both calls were the 15 s one's (cron-twice); the run log
    says whose the late one was. A due time run twice (two logged runs, or a run not
    logged, one attempt claimed) is still found."""
    cron = [(T + 10, "done", 1), (T + 15, "done", 1)]
    calls = [Call("cron:j1", [], [], T + 15.1, T + 15.2),
             Call("cron:j1", [], [], T + 16.0, T + 16.1)]
    h = _history([], calls, cron=cron, every=5)
    h.end = T + 18
    assert "cron-twice" in checker.check(h)  # by time alone (killed runs log nothing)
    h.cron_runs = [(T + 10, T + 10.0, T + 16.2), (T + 15, T + 15.0, T + 15.3)]
    assert checker.check(h) == {}  # 15.1 is in both spans: by time; 16.0 in due 10's only
    h.cron_runs = [(T + 10, T + 10.0, T + 10.2), (T + 15, T + 15.0, T + 15.3),
                   (T + 15, T + 15.9, T + 16.2)]  # due 15 run a second time
    h.calls.append(Call("cron:j1", [], [], T + 10.1, T + 10.15))
    assert "cron-twice" in checker.check(h)


def test_a_cron_call_in_several_runs_spans_counts_for_the_run_that_ended_after_it():
    """Runs of different replicas waiting for the lane in turn overlap: due 10 s ran on
    one replica from 13.6 to 17.8 s, due 15 s on another from 15.0 to 22.6 s (its turn
    came last), due 20 s from 20.0 to 20.2 s. The call at 17.2 s is in the spans of 10 and
    15, the one at 20.05 s in those of 15 and 20; by the latest due time the 15 s one got
    two calls (cron-twice). Each goes to the run that ended right after it. A due time
    whose run called the model twice is still found."""
    cron = [(T + 10, "done", 1), (T + 15, "done", 1), (T + 20, "done", 1)]
    calls = [Call("cron:j1", [], [], T + 17.2, T + 17.7),
             Call("cron:j1", [], [], T + 20.05, T + 20.15),
             Call("cron:j1", [], [], T + 22.5, T + 22.55)]
    h = _history([], calls, cron=cron, every=5)
    h.end = T + 24
    h.cron_runs = [(T + 10, T + 13.6, T + 17.8), (T + 15, T + 15.0, T + 22.6),
                   (T + 20, T + 20.0, T + 20.2)]
    assert checker.check(h) == {}
    h.calls.append(Call("cron:j1", [], [], T + 16.0, T + 16.1))  # due 10's run, again
    found = checker.check(h)
    assert list(found) == ["cron-twice"] and found["cron-twice"][0].startswith("due 10.00s")
