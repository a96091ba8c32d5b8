"""Control API routes of the scheduler (bearer token required):

- ``POST /api/system-event`` ``{text, session_key?, wake?: "now"|"next-heartbeat"}``;
  404 for a session that does not exist (the agent's main session and heartbeat
  sessions always accept: gateway events go there and the next beat reads them)
- ``GET /api/cron`` (jobs), ``POST /api/cron`` (add: ``{name, schedule, message,
  session_target?, agent?, delivery?, timeout?, delete_after_run?}``, see
  ``gateway.scheduling.wiring.job_from_spec``; 400 with the field named when invalid),
  ``GET /api/cron/{id}``, ``PATCH /api/cron/{id}`` (edit: see
  ``gateway.scheduling.cron_jobs.edit_fields``; the new schedule applies at once and the old one never
  fires again), ``DELETE /api/cron/{id}``, ``POST /api/cron/{id}/run``,
  ``POST /api/cron/{id}/enable``, ``POST /api/cron/{id}/disable``,
  ``GET /api/cron/{id}/runs?limit=N``
- ``POST /api/heartbeat/{agent}`` (request a beat now)

Jobs are returned in their ``jobs.json`` form (``scheduler.cron.store.job_to_dict``); the
list adds ``zone`` (the job's ``schedule.tz``, else the cron default) and ``next_runs``
(the next three regular runs as wall times in that zone, ``2026-12-02 07:00 JST``) so a
page shows them in the job's zone, not the browser's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from aiohttp import web

from gateway.routing import agent_of_key, canonical_key, main_session_key
from gateway.scheduling.cron_jobs import edit_fields, job_from_spec, job_json
from gateway.server.control_api import require_token
from gateway.sessions import identity
from scheduler.cron import crontab
from scheduler.cron.schedule import upcoming_runs
from scheduler.cron.service import CronJobBusy, CronJobNotFound


def _err(status: int, message: str) -> web.Response:
    return web.json_response({"ok": False, "error": message}, status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text='{"ok": false, "error": "body must be JSON"}',
                                 content_type="application/json") from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(text='{"ok": false, "error": "body must be an object"}',
                                 content_type="application/json")
    return data


def next_runs_in_zone(job: Any, now: float, cron: Any, n: int = 3) -> dict[str, Any]:
    """``{"zone", "next_runs"}`` of one job (see module docstring); a disabled job has
    no next runs."""
    zone = job.schedule.get("tz") or cron.tz_default
    if not job.enabled:
        return {"zone": zone, "next_runs": []}
    tz = crontab.resolve_tz(zone)
    try:
        runs = upcoming_runs(job, now, n, cron.tz_default)
    except ValueError:
        runs = []
    return {"zone": zone, "next_runs": [
        datetime.fromtimestamp(t, tz).strftime("%Y-%m-%d %H:%M %Z") for t in runs]}


class SchedulerHandlers:
    """The scheduler API's handlers (module docstring) over one gateway ``gw``; the
    ``/api/cron/{id}`` ones take ``(cron service, job id, request)`` and are wrapped by
    :meth:`job_route`."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.sched = gw.scheduling

    async def system_event(self, request: web.Request) -> web.Response:
        """Enqueue a system event: ``{text, session_key?, wake: now|next-heartbeat}``."""
        body = await _body(request)
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            return _err(400, "text is required")
        key = body.get("session_key") or main_session_key(self.gw.config.default_agent())
        if not isinstance(key, str):
            return _err(400, "session_key must be a string")
        key = canonical_key(key)
        try:
            agent = agent_of_key(key)
        except ValueError as exc:
            return _err(400, str(exc))
        if agent not in self.gw.agents:
            return _err(400, f"session key {key!r} names unknown agent {agent!r}")
        wake = body.get("wake", "next-heartbeat")
        if wake not in ("now", "next-heartbeat"):
            return _err(400, "wake must be 'now' or 'next-heartbeat'")
        if await identity.lookup(self.gw.agents[agent].store, key) is None \
                and key != main_session_key(agent) \
                and self.sched.heartbeat.agent_for_session(key) is None:
            # Nothing would ever drain it: refuse instead of saying "queued".
            return _err(404, f"no session {key}; `tidegate sessions list` shows the "
                             f"session keys")
        source, cluster = str(body.get("source") or "cli"), self.gw.cluster
        if cluster is not None:  # replicas: queued where the session's lane runs
            queued = await cluster.send_event(key, text, source, wake=wake == "now")
        else:
            queued = self.sched.enqueue(key, text, source, wake=wake == "now")
        return web.json_response({"ok": True, "session_key": key, "queued": queued,
                                  "wake": wake})

    def cron_or_404(self) -> Any:
        if self.sched.cron is None:
            raise web.HTTPServiceUnavailable(
                text=json.dumps({"ok": False, "error": self.sched.cron_unavailable()}),
                content_type="application/json")
        return self.sched.cron

    def job_route(self, fn: Callable[[Any, str, web.Request], Awaitable[Any]]) -> Any:
        async def handler(request: web.Request) -> web.Response:
            cron = self.cron_or_404()
            try:
                return web.json_response(await fn(cron, request.match_info["id"], request))
            except CronJobNotFound:
                return _err(404, f"no cron job {request.match_info['id']!r}")
            except CronJobBusy as exc:
                return _err(409, str(exc))
            except ValueError as exc:
                return _err(400, str(exc))
        return handler

    async def list_jobs(self, _: web.Request) -> web.Response:
        """Cron jobs, each with its zone and next three runs."""
        cron = self.cron_or_404()
        now = self.gw.clock.time()
        return web.json_response([{**job_json(j), **next_runs_in_zone(j, now, cron)}
                                  for j in await cron.list()])

    async def add_job(self, request: web.Request) -> web.Response:
        """Add a cron job (the fields of ``tidegate cron add``)."""
        cron = self.cron_or_404()
        body = await _body(request)
        gw = self.gw
        try:
            job = await cron.add(job_from_spec(body, now=gw.clock.time(), config=gw.config,
                                               channels={n for n, _ in gw.deliverer.channels}))
        except (ValueError, TypeError) as exc:
            return _err(400, str(exc))
        return web.json_response(job_json(job))

    async def get_job(self, cron: Any, job_id: str, _: web.Request) -> Any:
        """One cron job."""
        return job_json(await cron.get(job_id))

    async def edit_job(self, cron: Any, job_id: str, request: web.Request) -> Any:
        """Change a job in place: any of ``name``, ``schedule``, ``tz``, ``message``,
        ``session_target``, ``delivery``, ``timeout``."""
        fields = edit_fields(await cron.get(job_id), await _body(request),
                             now=self.gw.clock.time(), config=self.gw.config,
                             channels={n for n, _ in self.gw.deliverer.channels})
        return job_json(await cron.update(job_id, **fields))

    async def remove_job(self, cron: Any, job_id: str, _: web.Request) -> Any:
        """Remove a cron job."""
        await cron.remove(job_id)
        return {"ok": True, "removed": job_id}

    async def run_job(self, cron: Any, job_id: str, _: web.Request) -> Any:
        """Run a job now; answers with its outcome and reply."""
        outcome = await cron.run_now(job_id)
        return {"ok": outcome.status == "ok", "status": outcome.status, "error": outcome.error,
                "delivered": outcome.delivered, "reply": outcome.reply,
                "not_delivered": outcome.not_delivered}

    async def enable_job(self, cron: Any, job_id: str, _: web.Request) -> Any:
        """Enable a job."""
        return job_json(await cron.enable(job_id))

    async def disable_job(self, cron: Any, job_id: str, _: web.Request) -> Any:
        """Disable a job."""
        return job_json(await cron.disable(job_id))

    async def job_runs(self, cron: Any, job_id: str, request: web.Request) -> Any:
        """A job's run log (``?limit=N``)."""
        await cron.get(job_id)
        return await cron.runs(job_id, int(request.query.get("limit", "20")))

    async def heartbeat_now(self, request: web.Request) -> web.Response:
        """Request a heartbeat beat of this agent now."""
        agent = request.match_info["agent"].lower()
        if self.sched.heartbeat.request_heartbeat_now(agent, "api"):
            return web.json_response({"ok": True, "agent": agent})
        return _err(409, f"agent {agent!r} has no enabled heartbeat "
                         f"(configure agents.*.heartbeat with every > 0)")


def scheduler_routes(gw: Any) -> list[web.RouteDef]:
    h = SchedulerHandlers(gw)
    t = lambda handler: require_token(gw, handler)
    job = h.job_route
    return [
        web.post("/api/system-event", t(h.system_event)),
        web.get("/api/cron", t(h.list_jobs)),
        web.post("/api/cron", t(h.add_job)),
        web.get("/api/cron/{id}", t(job(h.get_job))),
        web.patch("/api/cron/{id}", t(job(h.edit_job))),
        web.delete("/api/cron/{id}", t(job(h.remove_job))),
        web.post("/api/cron/{id}/run", t(job(h.run_job))),
        web.post("/api/cron/{id}/enable", t(job(h.enable_job))),
        web.post("/api/cron/{id}/disable", t(job(h.disable_job))),
        web.get("/api/cron/{id}/runs", t(job(h.job_runs))),
        web.post("/api/heartbeat/{agent}", t(h.heartbeat_now)),
    ]
