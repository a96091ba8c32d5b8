"""Fork and rewind (gateway/sessions/fork.py), checked through the transcript files and
the timeline: the source transcript never changes, the new one holds exactly the first N
turns of it (bytes), and both timelines record what happened."""

from __future__ import annotations

import json
from pathlib import Path

from tests.channel_harness import run_cli, write_config
from tests.helpers import base_config, running_gateway

KEY = "agent:main:cli:dm:ann"


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def user_texts(path: Path) -> list[str]:
    out = []
    for line in lines(path)[1:]:
        msg = json.loads(line).get("message") or {}
        if msg.get("role") == "user":
            out.append(msg["content"][0]["text"])
    return out


async def events(gw, session_id: str) -> list[tuple[str, dict]]:
    await gw.timeline_hooks.flush()
    return [(e.event_type, e.content) for e in
            await gw.timeline_hooks.timeline.store.events(session_id)]


async def test_fork_and_rewind_keep_every_turn_and_record_it(tmp_path):
    cfg = base_config(tmp_path / "state")
    path = write_config(tmp_path, cfg)
    async with running_gateway(cfg) as gw:
        for i in range(1, 6):
            await gw.local.send(f"turn {i}", to="ann")
        store = gw.agents["main"].store
        src = store.get(KEY)
        sessions = gw.state_dir / "agents/main/sessions"
        source = sessions / f"{src.session_id}.jsonl"
        before = source.read_bytes()

        code, out, err = await run_cli(path, "sessions", "fork", KEY, "--at", "2", "--json")
        assert code == 0, err
        forked = json.loads(out)
        assert forked["session_key"].startswith(KEY + ":fork:")
        fork_file = sessions / f"{forked['session_id']}.jsonl"
        header = json.loads(lines(fork_file)[0])
        assert header["forkedFrom"] == {"sessionId": src.session_id, "sessionKey": KEY,
                                        "turns": 2}
        third = next(i for i, ln in enumerate(lines(source)) if b'"turn 3"' in ln)
        assert lines(fork_file)[1:] == lines(source)[1:third]  # byte for byte
        assert store.get(KEY).session_id == src.session_id  # the source goes on
        await gw.local.send("on the fork", session_key=forked["session_key"])
        assert user_texts(fork_file) == ["turn 1", "turn 2", "on the fork"]

        code, out, err = await run_cli(path, "sessions", "rewind", KEY, "--to", "3")
        assert code == 0 and "Rewound this session to turn 3 of 5" in out, err
        now = store.get(KEY)
        assert now.session_id != src.session_id
        await gw.local.send("after the rewind", to="ann")
        assert user_texts(sessions / f"{now.session_id}.jsonl") == [
            "turn 1", "turn 2", "turn 3", "after the rewind"]
        assert source.read_bytes() == before  # later turns kept, nothing rewritten

        old_events = await events(gw, src.session_id)
        marks = [c for t, c in old_events if t == "SYSTEM_EVENT"]
        assert {"kind": "fork", "turn": 2, "of_turns": 5,
                "new_session_key": forked["session_key"],
                "new_session_id": forked["session_id"]} in marks
        assert {"kind": "rewind", "turn": 3, "of_turns": 5, "new_session_key": KEY} in marks
        assert old_events[-1] == ("SESSION_END", {"reason": "rewind"})
        fourth = next(i for i, ln in enumerate(lines(source)) if b'"turn 4"' in ln)
        rewound = lines(sessions / f"{now.session_id}.jsonl")
        assert rewound[1:fourth] == lines(source)[1:fourth]
        new_events = await events(gw, now.session_id)
        assert new_events[0][0] == "SESSION_CREATE"
        assert new_events[1] == ("SYSTEM_EVENT", {
            "kind": "forked_from", "session_id": src.session_id, "session_key": KEY,
            "turns": 3, "entries": fourth - 1})
        assert (await gw.timeline_hooks.timeline.store.verify()).ok
        from runtime.timeline.export import describe_event  # as `timeline show` prints them
        assert [describe_event("SYSTEM_EVENT", c) for c in marks] == [
            f"forked at turn 2 of 5 -> {forked['session_key']} {forked['session_id']}",
            f"rewound to turn 3 of 5 -> {KEY}"]
        assert describe_event(*new_events[1]) == (
            f"forked from session {src.session_id} ({KEY}) at turn 3")

        # refusals name the reason; nothing changes
        code, _, err = await run_cli(path, "sessions", "rewind", KEY, "--to", "9")
        assert code == 1 and "the session has 4 turns; cannot rewind to turn 9" in err
        assert store.get(KEY).session_id == now.session_id


async def test_slash_fork_in_a_chat_goes_on_in_the_new_session(tmp_path):
    async with running_gateway(base_config(tmp_path / "state")) as gw:
        for i in range(1, 4):
            await gw.local.send(f"turn {i}", to="bob")
        key = "agent:main:cli:dm:bob"
        old = gw.agents["main"].store.get(key).session_id
        reply = await gw.local.send("/fork 1", to="bob")
        assert "Forked turn 1 of 3" in reply.text
        new = gw.agents["main"].store.get(key).session_id
        assert new != old
        await gw.local.send("next", to="bob")
        path = gw.state_dir / "agents/main/sessions" / f"{new}.jsonl"
        assert user_texts(path) == ["turn 1", "next"]
        assert "Cannot fork: no entry 'zz'" in (await gw.local.send("/fork zz", to="bob")).text
        assert "/fork [N]" in (await gw.local.send("/help", to="bob")).text


async def test_slash_fork_on_telegram(tmp_path, model, tg):
    from tests.channel_harness import until
    from tests.test_gateway_telegram import DM_KEY, USER, config, texts
    async with running_gateway(config(tmp_path, model, tg)) as gw:
        for i in (1, 2):
            tg.inject_message(f"turn {i}", chat_id=USER, user_id=USER)
            await until(lambda i=i: len(texts(tg, USER)) >= i, what=f"reply {i}")
        old = gw.agents["main"].store.get(DM_KEY).session_id
        tg.inject_message("/fork 1", chat_id=USER, user_id=USER)
        await until(lambda: any("Forked turn 1 of 2" in t for t in texts(tg, USER)),
                    what="the /fork notice")
        new = gw.agents["main"].store.get(DM_KEY).session_id
        assert new != old
        [only] = user_texts(gw.state_dir / "agents/main/sessions" / f"{new}.jsonl")
        assert only.endswith("turn 1")  # the user role carries the sender too


def _transcript(ids: list[str]) -> bytes:
    """A transcript whose turn i (one user message, one reply) has entry ids ids[2i],
    ids[2i+1]."""
    rows = [{"type": "session", "id": "s1"}]
    for i, eid in enumerate(ids):
        role = "user" if i % 2 == 0 else "assistant"
        rows.append({"type": "message", "id": eid, "message": {
            "role": role, "content": [{"type": "text", "text": f"{role} {i // 2 + 1}"}]}})
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def test_all_digit_entry_ids_are_no_turn_counts():
    """Entry ids are 8 hex characters, some of them all digits: one that is no turn count
    as written (more than the turns, leading zeros) is the entry; ``id:`` and ``turn:``
    say which outright (the control UI sends ``id:``)."""
    import pytest

    from gateway.sessions.fork import ForkError, cut_transcript
    raw = _transcript(["a1b2c3d4", "67176042", "00000003", "e5f6a7b8", "00000001", "9c9c9c9c"])
    assert cut_transcript(raw, "67176042").turns == 1  # was: "has 3 turns; cannot fork at"
    assert cut_transcript(raw, "00000003").turns == 2  # was: turn 3, silently
    assert cut_transcript(raw, "id:00000001").turns == 3
    assert cut_transcript(raw, "3").turns == 3 and cut_transcript(raw, "turn:1").turns == 1
    assert cut_transcript(raw, "").turns == 3 and cut_transcript(raw, "0").turns == 0
    with pytest.raises(ForkError, match="no entry '3'"):
        cut_transcript(raw, "id:3")
    with pytest.raises(ForkError, match="the session has 3 turns; cannot rewind to turn 9"):
        cut_transcript(raw, "turn:9", "rewind")
    with pytest.raises(ForkError, match="the session has 3 turns; cannot fork at turn 99"):
        cut_transcript(raw, "99")
    ui = (Path(__file__).parents[1] / "channels/webchat/static/index.html").read_text()
    assert '{at: "id:" + d.fork} : {to: "id:" + d.rewind}' in ui
