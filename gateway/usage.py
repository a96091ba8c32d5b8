"""The gateway's usage and budget service: every model call's usage goes to the ledger
(runtime/usage/ledger.py) with its cost, budgets are checked before every model call, and
alerts go to the owner's route.

Hooks: ``on_event`` (the event bus: ``message_end`` carries one call's model and usage),
``gate(agent_id, trigger)`` (AgentRunner's check before each model call; a refusal text or
None), ``usage_text`` (``/usage`` in chat), ``status()`` (``GET /status``), and the control
API routes ``GET /api/usage``, ``GET /api/budget``, ``POST /api/budget/raise``,
``POST /api/budget/reset``.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import structlog
from aiohttp import web

from gateway.service.storage import records
from runtime.clock import utc_iso
from runtime.usage.budget import BACKGROUND, Budgets
from runtime.usage.ledger import UsageLedger, channel_of_key
from runtime.usage.pricing import cost_usd, price_for
from runtime.usage.report import GROUPS, render, summarize

log = structlog.get_logger(__name__)


class UsageService:
    def __init__(self, gw: Any) -> None:
        self.gw = gw
        cfg = gw.config
        self.ledger = records(gw, "usage") or UsageLedger(gw.state_dir / "usage")
        self.tz = cfg.budgets.timezone or cfg.agent(cfg.default_agent()).user_timezone
        self.budgets = Budgets(cfg.budgets, tz=self.tz, clock=gw.clock,
                               state_path=gw.state_dir / "usage" / "budget_state.json")
        self._tasks: set[asyncio.Task] = set()
        self.on_cost: list[Any] = []  # (provider, model, usage, cost) observers (metrics)
        self._today: dict[str, Any] = {}  # PostgreSQL: the last read of today's totals
        self._today_at = ""
        self._refresh: asyncio.Task | None = None

    async def start(self) -> None:
        now = self.gw.clock.time()
        local = datetime.fromtimestamp(now, self.budgets.tz)
        month_start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        aread = getattr(self.ledger, "arecords", None)
        since = month_start.timestamp()
        self.budgets.load(await aread(since=since) if aread is not None else
                          self.ledger.records(since=since))
        if aread is not None:
            await self._read_today()
        self.gw.bus.subscribe(self.on_event, deltas=False)  # message_end only

    async def stop(self) -> None:
        if self._refresh is not None:
            await asyncio.gather(self._refresh, return_exceptions=True)
        # Still subscribed: turns that finish during the drain are recorded too (an append
        # after this reopens the month file; the handle is closed with the process).
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        self.ledger.close()

    # -- recording -------------------------------------------------------------------------
    def on_event(self, ev: Any) -> None:
        if ev.type != "message_end":
            return
        d = ev.data
        usage = d.get("usage") or {}
        provider, model = str(d.get("provider") or "echo"), str(d.get("model") or "")
        price = price_for(provider, model, self.gw.config.pricing)
        cost = cost_usd(usage, price)
        record = {"agent": ev.agent_id, "session_key": ev.session_key,
                  "channel": channel_of_key(ev.session_key), "trigger": d.get("trigger"),
                  "provider": provider, "model": model, "input": usage.get("input", 0),
                  "output": usage.get("output", 0), "cache_read": usage.get("cacheRead", 0),
                  "cache_write": usage.get("cacheWrite", 0), "cost_usd": round(cost, 8),
                  "priced": price is not None, "run_id": ev.run_id}
        try:
            self.ledger.append(record, self.gw.clock.time())
        except OSError as exc:
            log.error("usage_ledger_write_failed", error=str(exc))
        for observer in self.on_cost:
            observer(provider, model, usage, cost)
        for text in self.budgets.add(ev.agent_id, cost):
            log.warning("budget_alert", agent=ev.agent_id, text=text)
            self._spawn(self._alert(text))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _alert(self, text: str) -> None:
        target = self.gw.config.budgets.alert_target
        if target == "none":
            return
        from gateway.routing import Route
        if target == "last":
            route = self.gw.scheduling.agent_latest_route(self.gw.config.default_agent())
        else:
            route = Route.parse_target(target)
        if route is None:
            log.warning("budget_alert_undelivered", reason="no route to the owner yet")
            return
        await self.gw.deliverer.send(route, text, kind="alert")

    # -- checks ----------------------------------------------------------------------------
    def gate(self, agent_id: str, trigger: str) -> str | None:
        """The refusal notice when a model call for ``agent_id`` may not run now."""
        refusal = self.budgets.check(agent_id, trigger)
        if refusal is None:
            return None
        log.warning("budget_refused", agent=agent_id, trigger=trigger,
                    scope=refusal.cap.scope, cap_usd=refusal.cap.usd,
                    used_usd=round(refusal.used, 6), background=trigger in BACKGROUND)
        return refusal.notice

    # -- reporting -------------------------------------------------------------------------
    async def report(self, *, since: float | None, by: str = "model",
                     filters: dict[str, str] | None = None) -> dict[str, Any]:
        """The summary of the ledger since ``since`` (epoch s). On PostgreSQL the read is
        awaited (``arecords``), never blocking the loop; the files are read in place.
        Raises OSError when the ledger is unreadable."""
        filters = {k: v for k, v in (filters or {}).items() if v}
        aread = getattr(self.ledger, "arecords", None)
        rows = await aread(since=since) if aread is not None else \
            self.ledger.records(since=since)
        recs = (r for r in rows
                if all(str(r.get(k, "")).lower() == v.lower() for k, v in filters.items()))
        return summarize(recs, by=by, tz=self.tz)

    def today_start(self) -> float:
        local = datetime.fromtimestamp(self.gw.clock.time(), self.budgets.tz)
        return local.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()

    async def today(self) -> dict[str, Any]:
        """Today's totals (calls, tokens, cost), or ``{"error"}`` when unreadable."""
        try:
            return _totals((await self.report(since=self.today_start()))["total"])
        except OSError as exc:  # the ledger's database is unreachable: status still answers
            return {"error": str(exc)}

    def _today_in_place(self) -> dict[str, Any]:
        """``today`` read from the local files on the loop (embedded storage)."""
        try:
            return _totals(summarize(self.ledger.records(since=self.today_start()),
                                     tz=self.tz)["total"])
        except OSError as exc:
            return {"error": str(exc)}

    def status(self) -> dict[str, Any]:
        """For ``GET /status`` (synchronous): on PostgreSQL today's totals as last read
        (``as_of``), a fresh read started in the background for the next call."""
        if not hasattr(self.ledger, "arecords"):
            today = self._today_in_place()
        else:
            today = {**self._today, "as_of": self._today_at} if self._today else {
                "pending": "first read in progress"}
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.get_running_loop().create_task(self._read_today())
        return {"timezone": self.tz, "today": today,
                "budgets": self.budgets.status(list(self.gw.agents))}

    async def _read_today(self) -> None:
        self._today = await self.today()
        self._today_at = utc_iso(self.gw.clock.time())

    async def usage_text(self, agent_id: str, session_key: str) -> str:
        """``/usage``: this session today and this month, and the budgets in force."""
        lines = []
        for label, since in (("today", self.today_start()), ("this month", self._month())):
            session = (await self.report(since=since,
                                         filters={"session_key": session_key}))["total"]
            every = (await self.report(since=since))["total"]
            lines.append(f"Usage {label}: this session {session['calls']} calls, "
                         f"{session['input']}/{session['output']} tokens in/out, "
                         f"${session['cost_usd']:.4f}; all sessions ${every['cost_usd']:.4f}")
        for b in self.budgets.status([agent_id]):
            who = f" (agent {b['agent']})" if b["agent"] else ""
            lines.append(f"Budget {b['scope']}{who}: ${b['used']:.2f} of ${b['usd']:.2f} "
                         f"({b['share']:.0%})")
        return "\n".join(lines)

    def _month(self) -> float:
        local = datetime.fromtimestamp(self.gw.clock.time(), self.budgets.tz)
        return local.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def _totals(t: dict[str, Any]) -> dict[str, Any]:
    return {"calls": t["calls"], "input_tokens": t["input"], "output_tokens": t["output"],
            "cost_usd": t["cost_usd"]}


def usage_routes(gw: Any) -> list[web.RouteDef]:
    from gateway.server.control_api import require_token
    svc: UsageService = gw.usage

    async def get_usage(request: web.Request) -> web.Response:
        """Usage and cost from the ledger (``?since=&by=&agent=&session_key=&model=&channel=``)."""
        q = request.query
        by = q.get("by", "model")
        if by not in GROUPS:
            return web.json_response({"ok": False, "error": f"by must be one of "
                                      f"{', '.join(GROUPS)}"}, status=400)
        try:
            since = float(q["since"]) if q.get("since") else None
        except ValueError:
            return web.json_response({"ok": False, "error": "since: epoch seconds"},
                                     status=400)
        rep = await svc.report(since=since, by=by, filters={k: q.get(k, "") for k in (
            "agent", "session_key", "model", "channel")})
        return web.json_response({**rep, "timezone": svc.tz,
                                  "text": render(rep)})

    async def get_budget(_: web.Request) -> web.Response:
        """Budgets in force, spend so far and operator overrides."""
        return web.json_response({"timezone": svc.tz,
                                  "budgets": svc.budgets.status(list(gw.agents))})

    async def change_budget(request: web.Request) -> web.Response:
        """Operator override of a budget for the current period: ``raise`` ``{scope, usd,
        agent?}`` or ``reset`` ``{scope, agent?}``."""
        try:
            body = await request.json()
            scope, agent = body.get("scope", "daily"), body.get("agent")
            if request.match_info["action"] == "raise":
                svc.budgets.raise_cap(scope, float(body["usd"]), agent)
            else:
                svc.budgets.reset(scope, agent)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return web.json_response({"ok": False, "error": f"bad request: {exc}"},
                                     status=400)
        log.info("budget_override", action=request.match_info["action"], scope=scope,
                 agent=agent)
        return web.json_response({"ok": True, "budgets": svc.budgets.status(list(gw.agents))})

    t = lambda h: require_token(gw, h)
    return [web.get("/api/usage", t(get_usage)), web.get("/api/budget", t(get_budget)),
            web.post("/api/budget/{action:raise|reset}", t(change_budget))]
