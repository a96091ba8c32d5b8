"""scheduler/cron/crontab.py: crontab meaning, names, macros, Vixie dom/dow rule, DST."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from runtime.clock import parse_iso, utc_iso
from scheduler.cron.crontab import next_fire, parse


def fires(expr: str, start: str, n: int, tz: str = "UTC") -> list[str]:
    """The next n firings after ``start`` as ``YYYY-MM-DDTHH:MMZ`` UTC strings."""
    t, out = parse_iso(start), []
    for _ in range(n):
        t = next_fire(expr, t, tz)
        out.append(utc_iso(t)[:16] + "Z")
    return out


def test_weekdays_at_nine():
    # 2026-01-01 is a Thursday
    assert fires("0 9 * * 1-5", "2026-01-01T00:00Z", 4) == [
        "2026-01-01T09:00Z", "2026-01-02T09:00Z", "2026-01-05T09:00Z", "2026-01-06T09:00Z"]


def test_sunday_is_0_and_7_and_names():
    expected = ["2026-01-04T09:00Z", "2026-01-11T09:00Z"]
    assert fires("0 9 * * 0", "2026-01-01T00:00Z", 2) == expected
    assert fires("0 9 * * 7", "2026-01-01T00:00Z", 2) == expected
    assert fires("0 9 * * sun", "2026-01-01T00:00Z", 2) == expected
    assert fires("0 9 * * 5-7", "2026-01-01T00:00Z", 4) == [
        "2026-01-02T09:00Z", "2026-01-03T09:00Z", "2026-01-04T09:00Z", "2026-01-09T09:00Z"]
    assert parse("0 9 * * MON-fri").dows == (1, 2, 3, 4, 5)


def test_month_names_and_dom_combinations():
    assert fires("0 12 15 jan,JUL *", "2026-02-01T00:00Z", 3) == [
        "2026-07-15T12:00Z", "2027-01-15T12:00Z", "2027-07-15T12:00Z"]
    # the 31st only in months that have one
    assert fires("0 0 31 * *", "2026-01-31T00:00Z", 3) == [
        "2026-03-31T00:00Z", "2026-05-31T00:00Z", "2026-07-31T00:00Z"]
    assert fires("0 0 1 FEB-apr *", "2026-01-01T00:00Z", 4) == [
        "2026-02-01T00:00Z", "2026-03-01T00:00Z", "2026-04-01T00:00Z", "2027-02-01T00:00Z"]


def test_vixie_or_rule_when_both_day_fields_restricted():
    # the 13th OR any Friday (Jan 2026: Fridays 2, 9, 16)
    assert fires("0 0 13 * 5", "2026-01-01T00:00Z", 4) == [
        "2026-01-02T00:00Z", "2026-01-09T00:00Z", "2026-01-13T00:00Z", "2026-01-16T00:00Z"]
    # dom "*" (or "*/n", as in cronie) -> AND: only Fridays
    assert fires("0 0 * * 5", "2026-01-01T00:00Z", 2) == ["2026-01-02T00:00Z", "2026-01-09T00:00Z"]
    # */2 starts with '*': odd days that are also Fridays (Jan 9, Jan 23, Feb 13 ...)
    assert fires("0 0 */2 * 5", "2026-01-03T00:00Z", 3) == [
        "2026-01-09T00:00Z", "2026-01-23T00:00Z", "2026-02-13T00:00Z"]


def test_steps_ranges_lists():
    assert fires("*/15 * * * *", "2026-01-01T00:07Z", 4) == [
        "2026-01-01T00:15Z", "2026-01-01T00:30Z", "2026-01-01T00:45Z", "2026-01-01T01:00Z"]
    assert parse("10-50/10 * * * *").minutes == (10, 20, 30, 40, 50)
    assert parse("5/20 * * * *").minutes == (5, 25, 45)
    assert parse("1,2,5-7 0-23/6 * * *").minutes == (1, 2, 5, 6, 7)
    assert parse("1,2,5-7 0-23/6 * * *").hours == (0, 6, 12, 18)
    assert fires("0 22-23 * * *", "2026-01-01T22:30Z", 2) == [
        "2026-01-01T23:00Z", "2026-01-02T22:00Z"]


def test_macros():
    assert parse("@yearly").minutes == parse("0 0 1 1 *").minutes
    assert fires("@annually", "2026-03-01T00:00Z", 1) == ["2027-01-01T00:00Z"]
    assert fires("@monthly", "2026-03-05T00:00Z", 1) == ["2026-04-01T00:00Z"]
    assert fires("@weekly", "2026-01-01T00:00Z", 1) == ["2026-01-04T00:00Z"]  # Sunday
    assert fires("@daily", "2026-01-01T00:00Z", 1) == ["2026-01-02T00:00Z"]
    assert fires("@MIDNIGHT", "2026-01-01T00:00Z", 1) == ["2026-01-02T00:00Z"]
    assert fires("@hourly", "2026-01-01T00:30Z", 1) == ["2026-01-01T01:00Z"]


def test_leap_day():
    assert fires("0 0 29 2 *", "2026-01-01T00:00Z", 3) == [
        "2028-02-29T00:00Z", "2032-02-29T00:00Z", "2036-02-29T00:00Z"]
    # 2100 is not a leap year
    assert fires("0 0 29 2 *", "2096-03-01T00:00Z", 1) == ["2104-02-29T00:00Z"]


def test_strictly_after():
    t = parse_iso("2026-01-01T09:00:00Z")
    assert next_fire("0 9 * * *", t, "UTC") == t + 86400
    assert next_fire("0 9 * * *", t - 0.001, "UTC") == t


@pytest.mark.parametrize(("expr", "message"), [
    ("61 * * * *", "minute: 61 out of range 0-59"),
    ("* 24 * * *", "hour: 24 out of range 0-23"),
    ("* * 0 * *", "day-of-month: 0 out of range 1-31"),
    ("* * * 13 *", "month: 13 out of range 1-12"),
    ("* * * * 8", "day-of-week: 8 out of range 0-7"),
    ("* * * * FOO", "day-of-week: invalid value 'FOO'"),
    ("*/0 * * * *", "minute: invalid step"),
    ("5-1 * * * *", "minute: range 5-1 is reversed"),
    ("* * * *", "expected 5 fields"),
    ("1,,2 * * * *", "minute: empty list element"),
    ("@reboot", "unknown cron macro"),
    ("0 0 30 2 *", "can never fire"),
    ("0 0 31 4,6,9,11 *", "can never fire"),
])
def test_parse_errors_name_the_field(expr, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace("(", r"\(")):
        parse(expr)


def test_impossible_dom_allowed_when_dow_restricted():
    # Vixie OR rule: "30 Feb OR Mondays" can fire (on Mondays of February)
    assert fires("0 0 30 2 1", "2026-01-01T00:00Z", 1) == ["2026-02-02T00:00Z"]


def test_unknown_timezone():
    with pytest.raises(ValueError, match="unknown timezone 'Mars/Olympus'"):
        next_fire("* * * * *", 0, "Mars/Olympus")


# -- DST: spring forward -------------------------------------------------------------------

def test_spring_forward_new_york_fixed_time_runs_after_the_gap():
    # 2026-03-08: 02:00 EST -> 03:00 EDT (07:00Z). 02:30 does not exist: fire at 03:00 EDT.
    assert fires("30 2 * * *", "2026-03-07T00:00Z", 3, "America/New_York") == [
        "2026-03-07T07:30Z", "2026-03-08T07:00Z", "2026-03-09T06:30Z"]


def test_spring_forward_berlin_fixed_time_runs_after_the_gap():
    # 2026-03-29: 02:00 CET -> 03:00 CEST (01:00Z)
    assert fires("30 2 * * *", "2026-03-28T00:00Z", 3, "Europe/Berlin") == [
        "2026-03-28T01:30Z", "2026-03-29T01:00Z", "2026-03-30T00:30Z"]


def test_spring_forward_several_gap_slots_fire_once():
    got = fires("0,15,30,45 2 * * *", "2026-03-29T00:00Z", 2, "Europe/Berlin")
    assert got == ["2026-03-29T01:00Z", "2026-03-30T00:00Z"]


def test_spring_forward_wildcard_skips_nonexistent_slots():
    # */30 in New York: 01:00, 01:30 EST, then 03:00 EDT - every real slot once
    assert fires("*/30 * * * *", "2026-03-08T05:45Z", 4, "America/New_York") == [
        "2026-03-08T06:00Z", "2026-03-08T06:30Z", "2026-03-08T07:00Z", "2026-03-08T07:30Z"]
    assert fires("0 * * * *", "2026-03-29T00:00Z", 2, "Europe/Berlin") == [
        "2026-03-29T01:00Z", "2026-03-29T02:00Z"]  # 03:00 CEST, 04:00 CEST


# -- DST: fall back --------------------------------------------------------------------

def test_fall_back_new_york_fixed_time_fires_once():
    # 2026-11-01: 01:30 happens at 05:30Z (EDT) and 06:30Z (EST); fire only the first
    assert fires("30 1 * * *", "2026-10-31T12:00Z", 3, "America/New_York") == [
        "2026-11-01T05:30Z", "2026-11-02T06:30Z", "2026-11-03T06:30Z"]


def test_fall_back_berlin_fixed_time_fires_once():
    # 2026-10-25: 03:00 CEST -> 02:00 CET at 01:00Z; 02:30 at 00:30Z and 01:30Z
    assert fires("30 2 * * *", "2026-10-24T12:00Z", 2, "Europe/Berlin") == [
        "2026-10-25T00:30Z", "2026-10-26T01:30Z"]


def test_fall_back_wildcard_fires_every_real_slot():
    got = fires("*/30 * * * *", "2026-11-01T04:10Z", 7, "America/New_York")
    assert got == ["2026-11-01T04:30Z", "2026-11-01T05:00Z", "2026-11-01T05:30Z",
                   "2026-11-01T06:00Z", "2026-11-01T06:30Z", "2026-11-01T07:00Z",
                   "2026-11-01T07:30Z"]
    assert len(set(got)) == len(got)
    assert fires("0 * * * *", "2026-10-24T23:30Z", 4, "Europe/Berlin") == [
        "2026-10-25T00:00Z", "2026-10-25T01:00Z", "2026-10-25T02:00Z", "2026-10-25T03:00Z"]


def test_fall_back_from_inside_the_repeated_hour():
    # after 01:30 EDT (05:30Z) the next */30 slot is 01:00 EST (06:00Z), not 02:00
    t = parse_iso("2026-11-01T05:30Z")
    assert utc_iso(next_fire("*/30 * * * *", t, "America/New_York")) == "2026-11-01T06:00:00.000Z"
    # and a fixed 01:00 job does not fire again in the second 01:xx hour
    t = parse_iso("2026-11-01T05:00Z")
    assert utc_iso(next_fire("0 1 * * *", t, "America/New_York")) == "2026-11-02T06:00:00.000Z"


# -- cross-check against a brute-force reference ------------------------------------------

def _reference(expr: str, start: float, end: float, tz: str) -> list[float]:
    """Minute-by-minute over real UTC minutes, applying the documented DST rules."""
    c, zone, out = parse(expr), ZoneInfo(tz), []

    def wall_matches(w: datetime) -> bool:
        return (w.minute in c.minutes and w.hour in c.hours and w.month in c.months
                and c.day_matches(w.year, w.month, w.day))

    t = start // 60 * 60 + 60
    prev_off = datetime.fromtimestamp(t - 60, zone).utcoffset()
    while t <= end:
        local = datetime.fromtimestamp(t, zone)
        off = local.utcoffset()
        if off > prev_off and c.fixed_time:  # spring forward at t: walls in the gap
            w = (local - (off - prev_off)).replace(tzinfo=None)
            while w < local.replace(tzinfo=None):
                if wall_matches(w):
                    out.append(t)
                    break
                w += timedelta(minutes=1)
        naive = local.replace(tzinfo=None)
        if wall_matches(naive) and not (c.fixed_time and local.fold == 1) and (
                not out or out[-1] != t):
            out.append(t)
        prev_off, t = off, t + 60
    return [x for x in out if x > start]


@pytest.mark.parametrize("tz", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe",
                                "Australia/Sydney", "Asia/Kolkata", "America/Santiago"])
@pytest.mark.parametrize("expr", ["30 2 * * *", "*/20 * * * *", "15 1,2,3 * * *",
                                  "0 * * * 0", "45 */2 * * *", "*/7 2 * * *", "0 0 * * *"])
def test_matches_brute_force_around_transitions(tz, expr):
    zone = ZoneInfo(tz)
    # find this zone's transitions in 2026 by scanning hours
    starts, t0 = [], datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    prev = datetime.fromtimestamp(t0, zone).utcoffset()
    for h in range(1, 366 * 24):
        off = datetime.fromtimestamp(t0 + h * 3600, zone).utcoffset()
        if off != prev:
            starts.append(t0 + h * 3600 - 2 * 86400)
        prev = off
    starts = starts or [t0]
    for start in starts:
        end = start + 4 * 86400
        want = _reference(expr, start, end, tz)
        got, t = [], start
        while True:
            t = next_fire(expr, t, tz)
            if t > end:
                break
            got.append(t)
        assert [utc_iso(x) for x in got] == [utc_iso(x) for x in want], (tz, expr, utc_iso(start))


def test_fast_enough_and_no_minute_scan():
    c = parse("0 0 29 2 1")  # OR rule: Feb 29 or Mondays in February
    began = time.perf_counter()
    for i in range(200):
        next_fire(c, 1_767_225_600 + i * 86400 * 7, "Europe/Berlin")
    assert time.perf_counter() - began < 1.0  # a minute scan over a year would take minutes


def test_accepts_parsed_expr_and_tzinfo():
    c = parse("30 2 * * *")
    t = parse_iso("2026-03-28T00:00Z")
    assert next_fire(c, t, ZoneInfo("Europe/Berlin")) == next_fire("30 2 * * *", t,
                                                                   "Europe/Berlin")
    assert next_fire(c, t, None) == parse_iso("2026-03-28T02:30Z")
    assert c.fixed_time and not parse("*/5 2 * * *").fixed_time
    assert not parse("@hourly").fixed_time and parse("@daily").fixed_time


def test_a_leap_day_on_a_sunday_is_found_however_far_ahead():
    """``0 0 29 2 */7`` fires in 2032 and then in 2060: the search used to stop after 10
    years and lose the 2060 run."""
    from runtime.clock import parse_iso
    from scheduler.cron.crontab import next_fire
    expr = "0 0 29 2 */7"
    first = next_fire(expr, parse_iso("2026-12-03T00:00:00Z"))
    assert first == parse_iso("2032-02-29T00:00:00Z")
    assert next_fire(expr, first) == parse_iso("2060-02-29T00:00:00Z")
    assert next_fire(expr, parse_iso("2060-02-29T00:00:00Z")) == \
        parse_iso("2088-02-29T00:00:00Z")


@pytest.mark.parametrize(("expr", "field"), [
    ("١ * * * *", "minute"), ("0 ٢ * * *", "hour"), ("0 0 ３ * *", "day-of-month"),
    ("0 0 * * 1-٥", "day-of-week"), ("*/٥ * * * *", "minute"),
])
def test_non_ascii_digits_are_refused_naming_the_field(expr, field):
    from scheduler.cron.crontab import parse
    with pytest.raises(ValueError, match=rf"^{field}: invalid"):
        parse(expr)
