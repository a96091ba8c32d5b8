"""Five-field crontab expressions evaluated in an IANA timezone, DST-correct.

Implements the crontab(5) meaning used by Vixie cron / cronie (DESIGN.md "Scheduler",
seed 001 §9.4): ``minute hour day-of-month month day-of-week`` with ``*``, ranges ``1-5``,
steps ``*/15`` and ``10-50/10``, lists ``1,15,30``, month names ``JAN``-``DEC`` and day
names ``SUN``-``SAT`` (any case, also inside ranges), day-of-week ``0`` and ``7`` both
Sunday, and the macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``.
``N/step`` (no range) is accepted as ``N-max/step``, a common extension.

Day matching follows Vixie cron: when both day-of-month and day-of-week are restricted
a day matches if *either* matches, otherwise both must. As in cronie, a field that starts
with ``*`` (including ``*/2``) counts as unrestricted for this rule.

Daylight-saving time (what cronie does, and what cron users expect). A job is
*fixed-time* when neither its minute nor its hour field starts with ``*``
(``30 2 * * *``, ``@daily``); otherwise it is a *wildcard* job (``*/30 * * * *``,
``@hourly``, ``*/15 1 * * *``) — cronie's own ``MIN_STAR|HR_STAR`` distinction.

- Spring forward (a wall time that does not exist that day, e.g. 02:30 in Europe/Berlin
  on the last Sunday of March): a fixed-time job fires once at the first instant after
  the gap (03:00 local), as cronie runs such jobs right after the jump; several gap slots
  of one job collapse into that one firing. Wildcard jobs simply have no firing in the
  gap: they fire at every real instant that matches.
- Fall back (a wall time that occurs twice): a fixed-time job fires once, at the first
  occurrence; a wildcard job fires at each real instant, so ``*/30 * * * *`` fires every
  30 real minutes through the repeated hour and ``0 * * * *`` fires every real hour.

Assumes (true of every zone in tzdata since 1970) that a UTC offset never drops by more
than 3 hours at once and changes at most once within any 3 hours.

Why not APScheduler's ``CronTrigger`` (checked with 3.11.3): its day_of_week counts
0 = Monday, so ``from_crontab("0 9 * * 0")`` fires on Mondays and ``5`` means Saturday;
it combines day-of-month and day-of-week with AND (no Vixie OR rule); and across DST it
returns non-existent wall times (02:30 on spring-forward day) and fires fixed-time jobs
twice at fall-back. The crontab meaning and DST behaviour here are ours; the service's
timing uses the injectable clock (see ``scheduler/cron/service.py``).

Evaluation jumps field by field (month, day, hour, minute) over wall-clock values, so
``next_fire`` costs a handful of steps, not a scan of minutes. Expressions that can never
fire (``0 0 30 2 *``) are rejected by ``parse``.
"""

from __future__ import annotations

import calendar
import functools
from bisect import bisect_left
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["MACROS", "CronExpr", "next_fire", "parse", "resolve_tz"]

MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTH_NAMES = {n.lower(): i for i, n in enumerate(calendar.month_abbr) if n}
_DAY_NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
# name, low, high, names
_FIELDS = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day-of-month", 1, 31, None),
    ("month", 1, 12, _MONTH_NAMES),
    ("day-of-week", 0, 7, _DAY_NAMES),
)
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # Feb counts leap years
# The Gregorian calendar (leap years and weekdays together) repeats every 400 years, so a
# search over 401 years finds every expression's next time: 29 February on a Sunday
# (``0 0 29 2 */7``) comes in 2032 and then only in 2060. parse() refuses the expressions
# that can never fire (a date no month has); every date that exists falls on every weekday
# within the cycle (29 February too: 5 weekdays later every 4 years), so nothing parse()
# accepts can miss the window.
_SEARCH_YEARS = 401
_SLACK = 3 * 3600  # the largest offset drop we account for (see module docstring)
_EPOCH = datetime(1970, 1, 1)
_UTC = UTC


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed crontab expression (immutable, hashable).

    Value tuples are sorted; ``dows`` uses 0 = Sunday .. 6 = Saturday (7 folded into 0).
    ``dom_star``/``dow_star`` say whether the field starts with ``*`` (Vixie OR rule);
    ``fixed_time`` is True when neither minute nor hour starts with ``*`` (DST rules).
    """

    source: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    doms: tuple[int, ...]
    months: tuple[int, ...]
    dows: tuple[int, ...]
    dom_star: bool
    dow_star: bool
    fixed_time: bool

    def day_matches(self, year: int, month: int, day: int) -> bool:
        """Whether the calendar day matches the day-of-month / day-of-week fields."""
        dom_ok = day in self.doms
        dow_ok = (calendar.weekday(year, month, day) + 1) % 7 in self.dows
        if self.dom_star or self.dow_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok


def _parse_value(token: str, field: str, low: int, high: int, names) -> int:
    if names is not None and token.lower() in names:
        return names[token.lower()]
    if not (token.isascii() and token.isdigit()):  # int() would read "١" as 1
        raise ValueError(f"{field}: invalid value {token!r} (digits 0-9 only)")
    value = int(token)
    if not low <= value <= high:
        raise ValueError(f"{field}: {value} out of range {low}-{high}")
    return value


def _parse_field(text: str, field: str, low: int, high: int, names) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise ValueError(f"{field}: empty list element in {text!r}")
        rng, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdigit()) or int(step_text) == 0:
                raise ValueError(f"{field}: invalid step {step_text!r} in {part!r}")
            step = int(step_text)
        if rng == "*":
            start, stop = low, high
        elif "-" in rng:
            a, _, b = rng.partition("-")
            start = _parse_value(a, field, low, high, names)
            stop = _parse_value(b, field, low, high, names)
            if start > stop:
                raise ValueError(f"{field}: range {rng} is reversed")
        else:
            start = _parse_value(rng, field, low, high, names)
            stop = high if slash else start
        values.update(range(start, stop + 1, step))
    return values


@functools.lru_cache(maxsize=4096)
def parse(expr: str) -> CronExpr:
    """Parse a 5-field crontab expression or macro into a :class:`CronExpr`.

    Raises ``ValueError`` naming the bad field, e.g. ``"minute: 61 out of range 0-59"``,
    ``"expected 5 fields ..."``, or ``"... can never fire ..."`` for impossible
    day-of-month/month combinations such as ``0 0 30 2 *``. ``@reboot`` is not supported.
    """
    if not isinstance(expr, str):
        raise TypeError(f"cron expression must be a string, got {type(expr).__name__}")
    source = expr.strip()
    text = source
    if text.startswith("@"):
        macro = MACROS.get(text.lower())
        if macro is None:
            raise ValueError(f"unknown cron macro {text!r} (known: {', '.join(MACROS)})")
        text = macro
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(
            f"expected 5 fields (minute hour day-of-month month day-of-week), "
            f"got {len(parts)} in {source!r}"
        )
    sets = [_parse_field(p, *spec) for p, spec in zip(parts, _FIELDS)]
    dows = {d % 7 for d in sets[4]}
    dom_star, dow_star = parts[2].startswith("*"), parts[4].startswith("*")
    months, doms = sorted(sets[3]), sorted(sets[2])
    if dow_star and not dom_star and all(doms[0] > _MAX_DAYS[m] for m in months):
        raise ValueError(
            f"{source!r} can never fire: day-of-month {parts[2]} does not occur in month(s) "
            f"{parts[3]}"
        )
    return CronExpr(
        source=source,
        minutes=tuple(sorted(sets[0])),
        hours=tuple(sorted(sets[1])),
        doms=tuple(doms),
        months=tuple(months),
        dows=tuple(sorted(dows)),
        dom_star=dom_star,
        dow_star=dow_star,
        fixed_time=not (parts[0].startswith("*") or parts[1].startswith("*")),
    )


@functools.lru_cache(maxsize=512)
def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown timezone {name!r}") from exc


def resolve_tz(tz: str | tzinfo | None) -> tzinfo:
    """Return a tzinfo for an IANA name (``"Europe/Berlin"``), a tzinfo, or None (UTC).

    Raises ``ValueError`` for an unknown zone name.
    """
    if tz is None or tz == "UTC":
        return _UTC
    if isinstance(tz, tzinfo):
        return tz
    if not isinstance(tz, str) or not tz.strip():
        raise ValueError(f"unknown timezone {tz!r}")
    return _zone(tz.strip())


def _offset(zone: tzinfo, epoch: float) -> float:
    return datetime.fromtimestamp(epoch, zone).utcoffset().total_seconds()


def _wall_epoch(y: int, mo: int, d: int, h: int, mi: int) -> int:
    """Seconds of a naive wall time as if it were UTC (wall arithmetic only)."""
    return (datetime(y, mo, d).toordinal() - 719163) * 86400 + h * 3600 + mi * 60


def _next_wall(c: CronExpr, y: int, mo: int, d: int, h: int, mi: int, last_year: int):
    """First matching wall time >= (y, mo, d, h, mi); None after ``last_year``."""
    while y <= last_year:
        if mo not in c.months:  # jump to the next allowed month
            i = bisect_left(c.months, mo)
            if i == len(c.months):
                y, mo = y + 1, c.months[0]
            else:
                mo = c.months[i]
            d, h, mi = 1, 0, 0
            continue
        dim = calendar.monthrange(y, mo)[1]
        while d <= dim and not c.day_matches(y, mo, d):
            d, h, mi = d + 1, 0, 0
        if d > dim:
            y, mo, d, h, mi = (y + 1, 1, 1, 0, 0) if mo == 12 else (y, mo + 1, 1, 0, 0)
            continue
        i = bisect_left(c.hours, h)
        if i == len(c.hours):  # no hour left today
            d, h, mi = d + 1, 0, 0
            if d > dim:
                y, mo, d = (y + 1, 1, 1) if mo == 12 else (y, mo + 1, 1)
            continue
        if c.hours[i] != h:
            h, mi = c.hours[i], 0
        j = bisect_left(c.minutes, mi)
        if j == len(c.minutes):  # no minute left this hour
            h, mi = h + 1, 0
            continue
        return y, mo, d, h, c.minutes[j]
    return None


def _gap_end(zone: tzinfo, lo: float, hi: float, after_offset: float) -> float:
    """The transition instant in (lo, hi]: the first second whose offset is ``after_offset``."""
    lo_i, hi_i = int(lo), int(hi)
    while hi_i - lo_i > 1:
        mid = (lo_i + hi_i) // 2
        if _offset(zone, mid) == after_offset:
            hi_i = mid
        else:
            lo_i = mid
    return float(hi_i)


def _instants(c: CronExpr, zone: tzinfo, wall: tuple[int, int, int, int, int]) -> list[float]:
    """Real instants (epoch seconds) at which a matching wall time fires (DST rules)."""
    naive = datetime(*wall)
    w = _wall_epoch(*wall)
    o0 = naive.replace(tzinfo=zone, fold=0).utcoffset().total_seconds()
    o1 = naive.replace(tzinfo=zone, fold=1).utcoffset().total_seconds()
    if o0 == o1:
        return [w - o0]
    if o0 > o1:  # repeated wall time (fall back): fold=0 is the first occurrence
        return [w - o0] if c.fixed_time else [w - o0, w - o1]
    if not c.fixed_time:  # wall time inside a gap (spring forward)
        return []
    return [_gap_end(zone, w - o1, w - o0, o1)]


def next_fire(expr: str | CronExpr, after: float, tz: str | tzinfo | None = "UTC") -> float:
    """The first instant (epoch seconds) strictly after ``after`` at which ``expr`` fires.

    ``tz`` is an IANA zone name or tzinfo the expression is read in (None = UTC).
    DST rules are in the module docstring. Raises ``ValueError`` for a malformed
    expression or unknown zone, or if nothing fires within the 400-year calendar cycle
    (which parse() rules out, see ``_SEARCH_YEARS``).
    """
    c = expr if isinstance(expr, CronExpr) else parse(expr)
    zone = resolve_tz(tz)
    # Candidates are scanned in wall-clock order; with a fall-back ahead an instant after
    # ``after`` can have an earlier wall time than ``after`` itself, hence the lower start.
    o_after, o_ahead = _offset(zone, after), _offset(zone, after + _SLACK)
    start = after + min(o_after, o_ahead)
    # Without a drop ahead, walls up to wall(after)'s minute fire at or before ``after``.
    first = start // 60 * 60 + (60 if o_ahead >= o_after else 0)
    t = _EPOCH + timedelta(seconds=first)
    cur = (t.year, t.month, t.day, t.hour, t.minute)
    last_year = min(t.year + _SEARCH_YEARS, 9998)  # datetime ends in 9999
    best: float | None = None
    limit: int | None = None
    while True:
        wall = _next_wall(c, *cur, last_year)
        if wall is None:
            break
        w = _wall_epoch(*wall)
        if limit is not None and w > limit:
            break
        for inst in _instants(c, zone, wall):
            if inst > after and (best is None or inst < best):
                best = inst
        if best is not None and limit is None:
            # A later wall time can only fire earlier if the offset dropped in between.
            if best <= after + _SLACK and o_ahead == o_after:
                break  # no transition between after and best
            drop = _offset(zone, max(after, best - _SLACK)) - _offset(zone, best)
            if drop <= 0:
                break
            limit = w + int(drop)
        nxt = datetime(*wall) + timedelta(minutes=1)
        cur = (nxt.year, nxt.month, nxt.day, nxt.hour, nxt.minute)
    if best is None:
        raise ValueError(f"{c.source!r} does not fire within {_SEARCH_YEARS} years")
    return best
