"""Budgets: spend per day and month (globally and per agent) against the caps of the
``budgets`` config, checked before every model call.

Periods start at local midnight / the first of the month in the budget's timezone. Spend
comes from the usage ledger at start and from each call's cost afterwards. Refusal order:
background work (heartbeat, cron, subagents, system turns) stops at ``cap × (1 −
user_reserve)``, user turns at the cap, so the last share of a budget is kept for people.
Because the check runs before each call, at most one call can cross a cap. One alert per
cap and period at ``alert_at`` (remembered across restarts). Operator overrides —
``raise`` (a higher cap for the current period) and ``reset`` (spend so far in the period
no longer counts) — end with the period. State: ``<state_dir>/usage/budget_state.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from runtime.clock import Clock
from runtime.fsutil import atomic_write
from runtime.usage.config import BudgetsSection

BACKGROUND = frozenset({"heartbeat", "cron", "subagent", "system"})
SCOPES = ("daily", "monthly")
_ALL = "*"


@dataclass(frozen=True)
class Cap:
    scope: str          # daily | monthly
    agent: str | None   # None: every agent together
    usd: float


@dataclass(frozen=True)
class Refusal:
    """Why a model call may not run: the cap, what was used, and the notice for users."""

    cap: Cap
    used: float
    notice: str


class Budgets:
    def __init__(self, cfg: BudgetsSection, *, tz: str, clock: Clock,
                 state_path: Path) -> None:
        self.cfg = cfg
        self.tz_name = tz
        self.tz = ZoneInfo(tz)
        self.clock = clock
        self.state_path = state_path
        self.spend: dict[tuple[str, str, str], float] = {}
        self._period_cache: tuple[float, float, str, str] = (0.0, 0.0, "", "")
        self.state: dict[str, Any] = {"raise": [], "reset": [], "alerted": []}
        try:
            loaded = json.loads(state_path.read_text())
            if isinstance(loaded, dict):
                self.state.update({k: list(loaded.get(k) or []) for k in self.state})
        except (OSError, ValueError):
            pass

    # -- periods -------------------------------------------------------------------------
    def period(self, scope: str, now: float) -> str:
        """``YYYY-MM-DD`` (daily) or ``YYYY-MM`` (monthly) of epoch ``now`` in the budget's
        time zone. Every model call asks (its cost is counted per period), so the names
        are kept for the local day they belong to (and at most an hour)."""
        cached = self._period_cache
        if not cached[0] <= now < cached[1]:
            local = datetime.fromtimestamp(now, self.tz)
            start = datetime(local.year, local.month, local.day, tzinfo=self.tz).timestamp()
            end = min(self.resets_at("daily", now).timestamp(), now + 3600.0)
            cached = self._period_cache = (start, end, local.strftime("%Y-%m-%d"),
                                           local.strftime("%Y-%m"))
        return cached[2] if scope == "daily" else cached[3]

    def resets_at(self, scope: str, now: float) -> datetime:
        """The local start of the next period."""
        local = datetime.fromtimestamp(now, self.tz)
        if scope == "daily":
            nxt = (local + timedelta(days=1)).date()
        else:
            nxt = (local.replace(day=1) + timedelta(days=32)).replace(day=1).date()
        return datetime(nxt.year, nxt.month, nxt.day, tzinfo=self.tz)

    # -- spend ---------------------------------------------------------------------------
    def load(self, records: Any) -> None:
        """Count ledger records (``_t`` epoch seconds, ``agent``, ``cost_usd``)."""
        for rec in records:
            self._count(str(rec.get("agent") or "main"), float(rec.get("cost_usd") or 0),
                        rec["_t"])

    def _count(self, agent: str, cost: float, now: float) -> None:
        for scope in SCOPES:
            p = self.period(scope, now)
            for who in (_ALL, agent):
                self.spend[(scope, who, p)] = self.spend.get((scope, who, p), 0.0) + cost

    def used(self, cap: Cap, now: float) -> float:
        p = self.period(cap.scope, now)
        spent = self.spend.get((cap.scope, cap.agent or _ALL, p), 0.0)
        offset = max((r["offset"] for r in self.state["reset"] if self._matches(r, cap, p)),
                     default=0.0)
        return max(spent - offset, 0.0)

    @staticmethod
    def _matches(entry: dict[str, Any], cap: Cap, period: str) -> bool:
        return (entry.get("scope") == cap.scope and entry.get("agent") == cap.agent
                and entry.get("period") == period)

    def caps(self, agent: str, now: float) -> list[Cap]:
        """The caps that apply to ``agent`` now (operator raises applied)."""
        out: list[Cap] = []
        per = self.cfg.per_agent.get(agent)
        raises = self.state["raise"]
        if not (raises or per or self.cfg.daily_usd or self.cfg.monthly_usd):
            return out  # no caps configured (the default): every call asks
        for scope in SCOPES:
            p = self.period(scope, now) if raises else ""  # every turn asks: skip the clock
            for who, source in ((None, self.cfg), (agent, per)):
                usd = getattr(source, f"{scope}_usd", None) if source is not None else None
                raised = [r["usd"] for r in raises if self._matches(r, Cap(scope, who, 0), p)]
                if raised:
                    usd = raised[-1]
                if usd:
                    out.append(Cap(scope, who, float(usd)))
        return out

    # -- checks --------------------------------------------------------------------------
    def check(self, agent: str, trigger: str) -> Refusal | None:
        """None when a model call for ``agent`` (a turn of ``trigger``) may run now."""
        now = self.clock.time()
        share = 1.0 - self.cfg.user_reserve if trigger in BACKGROUND else 1.0
        for cap in self.caps(agent, now):
            used = self.used(cap, now)
            if used >= cap.usd * share:
                return Refusal(cap, used, self.notice(cap, now))
        return None

    def notice(self, cap: Cap, now: float) -> str:
        when = self.resets_at(cap.scope, now)
        what = "today's" if cap.scope == "daily" else "this month's"
        who = f"agent {cap.agent}: " if cap.agent else ""
        at = when.strftime("%H:%M") if cap.scope == "daily" else when.strftime("%Y-%m-%d %H:%M")
        return (f"{who}{what} budget (${cap.usd:.2f}) is used up; resets at {at} "
                f"{self.tz_name}.")

    def add(self, agent: str, cost: float) -> list[str]:
        """Count one call's cost; returns the alert texts that became due (each once per
        cap and period)."""
        now = self.clock.time()
        self._count(agent, cost, now)
        alerts = []
        for cap in self.caps(agent, now):
            used = self.used(cap, now)
            key = f"{cap.scope}:{cap.agent or _ALL}:{self.period(cap.scope, now)}"
            if used >= cap.usd * self.cfg.alert_at and key not in self.state["alerted"]:
                self.state["alerted"].append(key)
                alerts.append(self._alert_text(cap, used, now))
        if alerts:
            self._save()
        return alerts

    def _alert_text(self, cap: Cap, used: float, now: float) -> str:
        what = "today's" if cap.scope == "daily" else "this month's"
        who = f" for agent {cap.agent}" if cap.agent else ""
        when = self.resets_at(cap.scope, now).strftime("%Y-%m-%d %H:%M")
        return (f"Budget alert: {what} spend{who} is ${used:.2f} of ${cap.usd:.2f} "
                f"({used / cap.usd:.0%}). Resets at {when} {self.tz_name}. "
                f"`tidegate budget raise` lifts it for this period.")

    # -- operator overrides ----------------------------------------------------------------
    def raise_cap(self, scope: str, usd: float, agent: str | None = None) -> Cap:
        """A cap of ``usd`` for the rest of the current period. Raises ValueError."""
        if scope not in SCOPES or usd <= 0:
            raise ValueError("scope must be daily or monthly and usd > 0")
        p = self.period(scope, self.clock.time())
        self.state["raise"].append({"scope": scope, "agent": agent, "usd": usd, "period": p})
        self._save()
        return Cap(scope, agent, usd)

    def reset(self, scope: str, agent: str | None = None) -> float:
        """Spend so far in the current period stops counting; returns what was used."""
        if scope not in SCOPES:
            raise ValueError("scope must be daily or monthly")
        now = self.clock.time()
        p = self.period(scope, now)
        spent = self.spend.get((scope, agent or _ALL, p), 0.0)
        was = self.used(Cap(scope, agent, 0), now)
        self.state["reset"].append({"scope": scope, "agent": agent, "period": p,
                                    "offset": spent})
        self.state["alerted"] = [k for k in self.state["alerted"]
                                 if k != f"{scope}:{agent or _ALL}:{p}"]
        self._save()
        return was

    def _save(self) -> None:
        # Old periods' entries are dropped: an override ends with its period.
        now = self.clock.time()
        current = {self.period(s, now) for s in SCOPES}
        for k in ("raise", "reset"):
            self.state[k] = [e for e in self.state[k] if e.get("period") in current]
        self.state["alerted"] = [k for k in self.state["alerted"]
                                 if k.rsplit(":", 1)[-1] in current]
        self.state_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(self.state_path, json.dumps(self.state, indent=1).encode(), mode=0o600)

    def status(self, agents: list[str]) -> list[dict[str, Any]]:
        """Every cap in force with its spend: ``[{scope, agent, usd, used, share,
        resets_at}]``."""
        now = self.clock.time()
        seen, out = set(), []
        for agent in agents:
            for cap in self.caps(agent, now):
                if (cap.scope, cap.agent) in seen:
                    continue
                seen.add((cap.scope, cap.agent))
                used = self.used(cap, now)
                out.append({"scope": cap.scope, "agent": cap.agent, "usd": cap.usd,
                            "used": round(used, 6), "share": round(used / cap.usd, 4),
                            "resets_at": self.resets_at(cap.scope, now).isoformat()})
        return out
