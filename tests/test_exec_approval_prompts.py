"""The approval prompt text and buttons (gateway/approvals/prompts.py), shared by the
Telegram, Slack and Discord adapters: what the approver reads is what runs."""

from __future__ import annotations

from gateway.approvals.prompts import buttons, outcome_text, request_text
from runtime.approvals.store import ApprovalRequest


def _req(command: str, argv: list[str] | None = None) -> ApprovalRequest:
    return ApprovalRequest(id="ab12cd34", agent_id="main", session_key="agent:main:x",
                           session_id="s", tool="exec", command=command, argv=argv,
                           binary="/usr/bin/echo", reason="not in the allowlist",
                           requested_at=0.0, expires_at=120.0, approvers=["telegram:1"])


def test_a_long_command_is_marked_truncated_shows_its_tail_and_gets_only_deny():
    command = "echo " + "A" * 4500 + " ; touch LONGTAIL_EVIL"
    req = _req(command, argv=["echo", "A" * 4500, ";", "touch", "LONGTAIL_EVIL"])
    text = request_text(req, 0.0)
    assert len(text) < 1900  # fits Discord's 2,000, Slack's and Telegram's limits
    assert "TRUNCATED" in text and str(len(command)) in text
    assert "LONGTAIL_EVIL" in text  # the tail is shown
    assert "tidegate approvals allow ab12cd34" in text
    assert [b.label for b in buttons(req)] == ["Deny"]
    closed = outcome_text(req)
    assert "TRUNCATED" in closed and "LONGTAIL_EVIL" in closed
    # the longest text that still shows the command whole fits too
    big = _req("x" * 1000, argv=["x" * 1000])
    big.reason, big.session_key, big.binary = "r" * 5000, "k" * 5000, "/b" * 5000
    assert len(request_text(big, 0.0)) < 1900 and "TRUNCATED" not in request_text(big, 0.0)
    # a command that fits is shown whole, with its buttons
    short = _req("echo hi", argv=["echo", "hi"])
    assert "  echo hi\n" in request_text(short, 0.0)
    assert [b.label for b in buttons(short)] == ["Allow once", "Always allow", "Deny"]


def test_control_and_bidi_characters_are_shown_escaped():
    command = "rm -f \u202eelif_efas.txt\u202c G1\rtouch HIDDEN\u2066x\u2069\u200b\x1b[2K"
    text = request_text(_req(command), 0.0)
    for raw in ("\u202e", "\u202c", "\r", "\u2066", "\u2069", "\u200b", "\x1b"):
        assert raw not in text
    assert "\\u202eelif_efas.txt\\u202c G1\\rtouch HIDDEN\\u2066x\\u2069\\u200b\\x1b[2K" \
        in text
    assert "shown escaped" in text
    assert "\u202e" not in outcome_text(_req(command))


BLANK_LOOKING = ["\u3164", "\u2800", "\u115f", "\u1160", "\uffa0", "\u00a0", "\u3000",
                 "\u2007", "\u034f", "\ufe0f", "\U000e0100"]


def test_blank_looking_characters_are_shown_escaped():
    """Hangul fillers, the blank Braille pattern, spaces other than U+0020, variation
    selectors...: an argument made of them draws nothing (or looks like a word break),
    so the prompt writes them as escapes like the bidi controls."""
    command = "rm -rf " + " ".join(BLANK_LOOKING) + " ok"
    text = request_text(_req(command), 0.0)
    for raw in BLANK_LOOKING:
        assert raw not in text
    assert ("rm -rf \\u3164 \\u2800 \\u115f \\u1160 \\uffa0 \\xa0 \\u3000 \\u2007 "
            "\\u034f \\ufe0f \\U000e0100 ok") in text
    assert "shown escaped" in text
    # ordinary text stays as it is: letters of any script, an emoji, a plain space
    plain = "echo héllo 日本語 한국어 ⠁ 👍"
    assert f"  {plain}\n" in request_text(_req(plain), 0.0)


def test_timeline_show_describes_approval_events():
    from runtime.timeline.export import describe_event
    asked = describe_event("SYSTEM_EVENT", {"kind": "exec_approval", "event": "requested",
                                            "id": "ab12", "command": "touch G1",
                                            "reason": "not in the allowlist"})
    assert asked == "approval ab12 requested: touch G1 — not in the allowlist"
    decided = describe_event("SYSTEM_EVENT", {"kind": "exec_approval", "event": "allowed",
                                              "id": "ab12", "command": "touch G1",
                                              "by": "telegram:1001", "always": True})
    assert decided == "approval ab12 allowed (always) by telegram:1001: touch G1"


def test_discord_shows_the_prompt_literally():
    from channels.discord.buttons import literal
    shown = literal("rm ||hidden|| `x` *b*")
    assert shown.startswith("```\n") and shown.endswith("\n```") and shown.count("`") == 6
    assert "||hidden||" in shown and "*b*" in shown and len(literal("a" * 5000)) <= 2000


async def test_the_cli_lists_a_command_whole_with_its_control_characters_escaped(tmp_path):
    from runtime.approvals.store import ApprovalStore
    from tests.channel_harness import run_cli, write_config
    from tests.helpers import base_config
    path = write_config(tmp_path, base_config(tmp_path / "state", "http://127.0.0.1:9/v1"))
    (tmp_path / "state").mkdir(exist_ok=True)
    command = "rm -f \u202eelif_efas.txt\u202c G1\rtouch HIDDEN " + "A" * 3000 + " TAIL"
    req = _req(command)
    req.expires_at = 4e9
    ApprovalStore(tmp_path / "state").add(req)
    rc, out, err = await run_cli(path, "approvals", "list")  # the gateway is down: the file
    assert rc == 0, err
    assert "\u202e" not in out and "\r" not in out
    assert "\\u202eelif_efas.txt\\u202c G1\\rtouch HIDDEN" in out and " TAIL" in out


def test_a_typed_backslash_escape_cannot_pass_for_an_escaped_character():
    from gateway.approvals.prompts import visible
    typed, real = "rm \\u202e x", "rm \u202e x"
    assert visible(typed) == "rm \\\\u202e x" and visible(real) == "rm \\u202e x"
    assert visible(typed) != visible(real)
    text = request_text(_req("printf 'a\\tb'"), 0.0)
    assert "  printf 'a\\\\tb'\n" in text and "shown escaped" not in text  # visible anyway


def test_default_ignorable_and_filler_characters_are_shown_escaped():
    """Unicode's default-ignorable code points and every script's fillers draw nothing:
    the Khitan filler (a combining mark), a Mongolian variation selector, the reserved
    U+FFF0 and tag range, the Hangul fillers."""
    from gateway.approvals.prompts import visible
    for ch in ("\U00016fe4", "\u180f", "\ufff0", "\U000e0080", "\U000e0fff", "\u2065",
               "\u17b4", "\u115f", "\U0001d159", "\u2800", "\U0001d173", "\u3164",
               "\ufe0f", "\U000e0101", "\u303f"):
        assert visible(f"a{ch}b") == f"a\\{'U%08x' if ord(ch) > 0xffff else 'u%04x'}b" % (
            ord(ch),), hex(ord(ch))
    plain = "echo é ü ñ ก้ 한 ⠁ ✓"  # combining marks on letters draw: left alone
    assert visible(plain) == plain


async def test_the_cli_and_the_api_escape_every_listed_text(tmp_path):
    """Not only the command: the why line, the session key, the decider and the always
    allowed patterns are escaped in ``tidegate approvals list``, and the control API's
    ``always`` entries have ``shown`` fields."""
    import json

    from runtime.approvals.store import ApprovalStore
    from tests.channel_harness import run_cli, write_config
    from tests.helpers import base_config, running_gateway
    cfg = base_config(tmp_path / "state", "http://127.0.0.1:9/v1")
    path = write_config(tmp_path, cfg)
    (tmp_path / "state").mkdir(exist_ok=True)
    store = ApprovalStore(tmp_path / "state")
    pending = _req("echo hi")
    pending.expires_at, pending.session_key = 4e9, "agent:main:\u202eyek"
    pending.reason = "not in the allowlist\u2066 (approved by the owner)\u2069"
    decided = _req("echo bye")
    decided.id, decided.status, decided.decided_at = "ef56ab78", "allowed", 1.0
    decided.decided_by = "telegram:1001\u3164"
    store.add(pending)
    store.add(decided)
    store.add_pattern("main", "/usr/bin/rm -rf \u202e/ x", "telegram:\u200b1001", 1.0)
    raw = ("\u202e", "\u2066", "\u2069", "\u3164", "\u200b")
    rc, out, err = await run_cli(path, "approvals", "list")  # the gateway is down: the file
    assert rc == 0, err
    assert not [c for c in raw if c in out], out
    for shown in ("agent:main:\\u202eyek", "\\u2066 (approved by the owner)\\u2069",
                  "telegram:1001\\u3164", "rm -rf \\u202e/ x", "telegram:\\u200b1001"):
        assert shown in out
    async with running_gateway(cfg):
        rc, out, err = await run_cli(path, "approvals", "list", "--json")
        assert rc == 0, err
        [pattern] = json.loads(out)["always"]["main"]
        assert pattern["shown"] == {"pattern": "/usr/bin/rm -rf \\u202e/ x",
                                    "by": "telegram:\\u200b1001", "escaped": True}
        rc, out, err = await run_cli(path, "approvals", "list")
        assert rc == 0 and not [c for c in raw if c in out], out
