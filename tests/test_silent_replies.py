"""Silent replies (issue 13 "Silent replies"): the rules of channels/outbound/silent.py, then the
variants through the whole gateway on Telegram — what the fake platform received, what stayed
in the transcript, and the group-chat prompt note."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from channels.outbound.silent import SilentStream, may_become_silent, silent_reply
from tests.channel_harness import chat_requests, sessions_with, until
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(40),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER, GROUP = 4242, -1001234567890
DM_KEY = f"agent:main:telegram:dm:{USER}"

# (model reply, delivered text or None for silent)
VARIANTS = [
    ("NO_REPLY", None),
    ("  \n NO_REPLY \n\n", None),
    ("**NO_REPLY**", None),
    ("`NO_REPLY`", None),
    ("Noted, nothing to add.\n\nNO_REPLY", None),
    ("NO_REPLY — the others are just chatting", None),
    ("When I have nothing to say I answer NO_REPLY and stay quiet.",
     "When I have nothing to say I answer and stay quiet."),
    ("no_reply is not the token", "no_reply is not the token"),
    ("NO_REPLYING is a different word", "NO_REPLYING is a different word"),
    # a token wrapped only in quotes or markup is the bare token (they delivered "" and «»)
    ('"NO_REPLY"', None),
    ("«NO_REPLY»", None),
    ("“NO_REPLY.”", None),
    ("<code>NO_REPLY</code>", None),
    ("<b><i>NO_REPLY</i></b>", None),
    ("<code>HEARTBEAT_OK</code> all good", None),
    ('I would say "NO_REPLY" here.', "I would say here."),
]


@pytest.mark.parametrize("reply,delivered", VARIANTS)
def test_rules(reply, delivered):
    verdict = silent_reply(reply)
    assert verdict.silent is (delivered is None)
    if delivered is not None:
        assert verdict.text == delivered


def test_code_indentation_survives_token_removal():
    text = "Use NO_REPLY like this:\n\n```\n    indented  code\n```"
    assert silent_reply(text).text == "Use like this:\n\n```\n    indented  code\n```"


def stream(pieces: list[str], reply: str | None = None) -> tuple[list[str], SilentStream]:
    shown = SilentStream()
    out = [shown.push(p) for p in pieces]
    return [*out, shown.end("".join(pieces) if reply is None else reply)], shown


@pytest.mark.parametrize("split", [list, lambda t: t.split(" ")])
@pytest.mark.parametrize("reply,delivered", VARIANTS)
def test_silent_stream_shows_what_would_be_delivered(reply, delivered, split):
    """The local surfaces' streams (OpenAI SSE, webchat, CLI) by character and by word:
    the text shown adds up to the delivered text; of a silent reply nothing shows, except
    the note before a trailing token, which streamed before the token came."""
    pieces = split(reply)
    if split is not list:
        pieces = [p + " " for p in pieces[:-1]] + pieces[-1:]
    out, shown = stream(pieces)
    assert shown.silent is (delivered is None)
    if delivered is not None:
        assert "".join(out) == shown.reply == delivered
    elif not reply.endswith("\n\nNO_REPLY"):
        assert "".join(out) == ""
    else:
        assert "".join(out) == "Noted, nothing to add."


def test_silent_stream_rounds_and_replies_that_did_not_stream():
    shown = SilentStream()
    assert shown.push("Let me ") == "Let me" and shown.push("check.") == " check."
    assert shown.round_end() == ""
    assert shown.push("NO_REPLY") == "" and shown.end("NO_REPLY") == ""
    assert shown.silent and shown.reply == ""
    assert stream([], "/status: ok")[0] == ["/status: ok"]  # nothing streamed: all of it
    assert stream(["HEARTB", "EAT_OK"])[0] == ["", "", ""]
    # a word that may be a token's start waits for the next one, then both go
    assert stream(["Ask ", "NO", "W ", "please"])[0] == ["Ask", "", " NOW", " please", ""]


def test_stream_holds_back_a_leading_token():
    assert may_become_silent("") and may_become_silent("**NO_RE")
    assert may_become_silent("NO_REPLY and more") and may_become_silent("HEARTB")
    assert not may_become_silent("Hello") and not may_become_silent("No, I think")


def transcript(state_dir: Path, session_id: str) -> list[dict]:
    path = state_dir / "agents" / "main" / "sessions" / f"{session_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_variants_through_the_gateway(tmp_path):
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        try:
            section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                       "poll_timeout": 1, "dm_policy": "open", "group_policy": "allowlist",
                       "groups": [str(GROUP)], "streaming": "off"}
            cfg = base_config(tmp_path / "state", model.base_url,
                              channels={"telegram": section})
            async with running_gateway(cfg) as gw:
                for i, (reply, _) in enumerate(VARIANTS):
                    model.script_text(reply)
                    tg.inject_message(f"message {i}", chat_id=USER, user_id=USER)
                    await until(lambda i=i: len(chat_requests(model)) == i + 1,
                                what=f"turn {i}")
                model.script_text("sentinel")
                tg.inject_message("last", chat_id=USER, user_id=USER)
                await until(lambda: any(m["text"] == "sentinel"
                                        for m in tg.bot_messages(USER)), what="sentinel")
                model.script_text("NO_REPLY")
                tg.inject_message("@tidegate_test_bot hi all", chat_id=GROUP, user_id=USER)
                await until(lambda: len(chat_requests(model)) == len(VARIANTS) + 2,
                            what="the group turn")
                on_disk = await sessions_with(gw.state_dir, DM_KEY)
            delivered = [m["text"] for m in tg.bot_messages(USER)]
            assert delivered == [d for _, d in VARIANTS if d is not None] + ["sentinel"]
            assert tg.bot_messages(GROUP) == []
            # silent turns stay in the transcript, as the model wrote them
            lines = transcript(gw.state_dir, on_disk[DM_KEY]["session_id"])
            said = [e["message"]["content"] for e in lines if e.get("type") == "message"
                    and e["message"]["role"] == "assistant"]
            flat = [c if isinstance(c, str) else "".join(p.get("text", "") for p in c)
                    for c in said]
            assert flat[:len(VARIANTS)] == [r for r, _ in VARIANTS]
            # only the group turn's prompt tells the model about the silent token
            systems = [r["messages"][0]["content"] for r in chat_requests(model)]
            assert "reply with exactly NO_REPLY" in systems[-1]
            assert not any("reply with exactly NO_REPLY" in s for s in systems[:-1])
        finally:
            await tg.stop()


def test_a_rerun_attempt_streams_on_from_where_the_first_was_cut_off():
    """A streamed turn re-run after its replica died (a second ``agent_start`` of the same
    run): its deltas used to be appended to the first attempt's, so the client read the
    answer's beginning twice. Now the second attempt shows only what goes past the text
    already shown; a different answer shows nothing more (shown text is never taken
    back), and the end does not repeat anything."""
    from channels.outbound.silent import SilentStream
    s = SilentStream()
    s.attempt()
    shown = [s.push(d) for d in ("Hello ", "wor")]
    s.attempt()  # the takeover's re-run, from the start
    shown += [s.push(d) for d in ("Hel", "lo ", "world", " and more.")]
    shown.append(s.end("Hello world and more."))
    assert "".join(shown) == "Hello world and more."
    other = SilentStream()
    other.attempt()
    first = other.push("Hello there ")
    other.attempt()
    rest = [other.push(d) for d in ("Something ", "else.")] + [other.end("Something else.")]
    assert first + "".join(rest) == first
