"""scheduler/heartbeat/rules.py: HEARTBEAT_OK ack, empty HEARTBEAT.md, active hours, dedupe."""

from __future__ import annotations

import pytest

from runtime.clock import FakeClock, parse_iso
from scheduler.heartbeat.rules import (
    HEARTBEAT_TOKEN,
    AckResult,
    DeliveryDeduper,
    default_heartbeat_prompt,
    heartbeat_file_is_empty,
    in_active_hours,
    strip_heartbeat_ack,
)


@pytest.mark.parametrize("reply", [
    "HEARTBEAT_OK", "  HEARTBEAT_OK\n", "**HEARTBEAT_OK**", "_HEARTBEAT_OK_", "`HEARTBEAT_OK`",
    "HEARTBEAT_OK.", "HEARTBEAT_OK!", "**HEARTBEAT_OK**.", "__HEARTBEAT_OK__",
    '"HEARTBEAT_OK"', "«HEARTBEAT_OK»", "<code>HEARTBEAT_OK</code>", "<b>HEARTBEAT_OK</b>.",
])
def test_bare_and_wrapped_tokens_are_acks(reply):
    assert strip_heartbeat_ack(reply) == AckResult(True, "")


def test_token_in_html_with_a_note_is_an_ack_without_the_markup():
    assert strip_heartbeat_ack("<code>HEARTBEAT_OK</code> all good") == AckResult(
        True, "all good")


def test_short_note_with_token_is_ack():
    assert strip_heartbeat_ack("HEARTBEAT_OK - all quiet, 3 builds green") == AckResult(
        True, "all quiet, 3 builds green")
    assert strip_heartbeat_ack("Checked the inbox, nothing new.\n\n**HEARTBEAT_OK**") == \
        AckResult(True, "Checked the inbox, nothing new.")


def test_long_note_is_not_an_ack_and_token_is_stripped():
    alert = "Disk on db-1 is 97% full. " * 20
    result = strip_heartbeat_ack(f"HEARTBEAT_OK {alert}")
    assert result == AckResult(False, alert.strip())
    result = strip_heartbeat_ack(f"{alert}\nHEARTBEAT_OK")
    assert result.is_ack is False and result.remaining == alert.strip()


def test_ack_max_chars_boundary():
    note = "x" * 300
    assert strip_heartbeat_ack(f"HEARTBEAT_OK {note}").is_ack is True
    assert strip_heartbeat_ack(f"HEARTBEAT_OK {note}y").is_ack is False
    assert strip_heartbeat_ack("HEARTBEAT_OK abc", ack_max_chars=2) == AckResult(False, "abc")


@pytest.mark.parametrize("reply", [
    "I would normally say HEARTBEAT_OK but the deploy failed.",
    "The build broke; HEARTBEAT_OK is not appropriate here, see logs",
    "HEARTBEAT_OKAY",
    "XHEARTBEAT_OK",
    "heartbeat_ok",
    "Deploy failed.",
])
def test_token_in_the_middle_or_absent_is_not_an_ack(reply):
    assert strip_heartbeat_ack(reply) == AckResult(False, reply)


def test_empty_reply():
    assert strip_heartbeat_ack("") == AckResult(False, "")


def test_token_constant_and_default_prompt():
    assert HEARTBEAT_TOKEN == "HEARTBEAT_OK"
    assert default_heartbeat_prompt() == (
        "Read HEARTBEAT.md if it exists (workspace context). Follow it strictly. "
        "Do not infer or repeat old tasks from prior chats. "
        "If nothing needs attention, reply HEARTBEAT_OK.")


@pytest.mark.parametrize("text", [
    None, "", "\n\n  \n", "# Heartbeat\n\n## Checks\n", "# Tasks\n- \n* \n- [ ]\n- [x]\n1.\n",
    "<!-- add tasks here -->\n# Heartbeat\n", "<!--\nmulti\nline\n-->\n", "---\n# T\n***\n",
    "# Heartbeat\n<!-- unterminated comment\n- check disk\n",
])
def test_heartbeat_file_empty_variants(text):
    assert heartbeat_file_is_empty(text) is True


@pytest.mark.parametrize("text", [
    "- check disk usage on db-1", "# Heartbeat\n\nCheck the inbox.", "- [ ] rotate logs",
    "<!-- note -->\nping the API", "#hashtag-not-a-heading", "* [ ] x",
])
def test_heartbeat_file_with_content(text):
    assert heartbeat_file_is_empty(text) is False


def test_active_hours_simple_window_in_timezone():
    # 2026-01-15 08:30Z is 09:30 in Berlin (CET) and 03:30 in New York (EST)
    t = parse_iso("2026-01-15T08:30:00Z")
    assert in_active_hours(t, "09:00", "22:00", "Europe/Berlin") is True
    assert in_active_hours(t, "09:00", "22:00", "America/New_York") is False
    assert in_active_hours(t, "09:00", "22:00", None) is False  # UTC 08:30
    assert in_active_hours(parse_iso("2026-01-15T08:00:00Z"), "09:00", "22:00",
                           "Europe/Berlin") is True  # start inclusive
    assert in_active_hours(parse_iso("2026-01-15T21:00:00Z"), "09:00", "22:00",
                           "Europe/Berlin") is False  # end exclusive


def test_quiet_hours_across_midnight_in_non_utc_tz():
    tz = "Asia/Tokyo"  # UTC+9
    def at(utc: str) -> bool:
        return in_active_hours(parse_iso(utc), "22:00", "06:00", tz)
    assert at("2026-01-15T13:00:00Z") is True   # 22:00 JST
    assert at("2026-01-15T18:30:00Z") is True   # 03:30 JST
    assert at("2026-01-15T20:59:00Z") is True   # 05:59 JST
    assert at("2026-01-15T21:00:00Z") is False  # 06:00 JST
    assert at("2026-01-15T03:00:00Z") is False  # 12:00 JST


def test_active_hours_24_00_and_always():
    t = parse_iso("2026-01-15T23:59:30Z")
    assert in_active_hours(t, "08:00", "24:00", "UTC") is True
    assert in_active_hours(parse_iso("2026-01-15T07:00:00Z"), "08:00", "24:00", "UTC") is False
    assert in_active_hours(t, "10:00", "10:00", "UTC") is True
    assert in_active_hours(t, "00:00", "24:00", "UTC") is True


@pytest.mark.parametrize(("start", "end", "msg"), [
    ("9", "17:00", "expected HH:MM"), ("24:00", "10:00", "00:00-23:59"),
    ("09:00", "24:01", "24:00"), ("09:60", "10:00", "00:00-23:59"),
])
def test_active_hours_bad_input(start, end, msg):
    with pytest.raises(ValueError, match=msg):
        in_active_hours(0, start, end, "UTC")


def test_active_hours_unknown_tz():
    with pytest.raises(ValueError, match="unknown timezone"):
        in_active_hours(0, "09:00", "17:00", "Atlantis/Capital")


def test_dedupe_within_window_and_expiry():
    clock = FakeClock()
    d = DeliveryDeduper(clock)
    assert d.seen("main", "Disk 97% full") is False
    d.record("main", "Disk 97% full")
    assert d.seen("main", "  Disk   97%\nfull ") is True  # whitespace normalised
    assert d.seen("other-agent", "Disk 97% full") is False
    assert d.seen("main", "Disk 98% full") is False
    clock.set_wall(clock.time() + 86399)
    assert d.seen("main", "Disk 97% full") is True
    clock.set_wall(clock.time() + 1)
    assert d.seen("main", "Disk 97% full") is False  # 24 h later it may be delivered again
    assert len(d) == 0  # pruned


async def test_dedupe_memory_is_bounded():
    clock = FakeClock()
    d = DeliveryDeduper(clock, window=3600, max_entries=100)
    for i in range(500):
        d.record("main", f"alert {i}")
        await clock.advance(1)
    assert len(d) == 100
    assert d.seen("main", "alert 499") and not d.seen("main", "alert 0")
    await clock.advance(3600)
    d.record("main", "fresh")
    assert len(d) == 1


def test_delivery_deduper_survives_a_restart(tmp_path):
    from runtime.clock import FakeClock
    from scheduler.heartbeat.rules import DeliveryDeduper

    clock = FakeClock()
    path = tmp_path / "heartbeat" / "delivered.json"
    first = DeliveryDeduper(clock, path=path)
    first.record("main", "ALERT: disk / is 95% full")
    again = DeliveryDeduper(clock, path=path)  # a new process
    assert again.seen("main", "ALERT:  disk / is 95% full")
    clock.set_wall(clock.time() + 86401)
    assert not DeliveryDeduper(clock, path=path).seen("main", "ALERT: disk / is 95% full")
