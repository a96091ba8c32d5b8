"""Prometheus metrics (``GET /metrics``, text exposition format via prometheus-client).

Each gateway has its own registry. Counters and histograms are fed by the event bus
(turns, model calls), the usage service (tokens, cost), the intake (inbound outcomes), the
cron service, the heartbeat runner and the timeline writer; gauges (lanes, channels,
outbox) are read from the gateway when scraped. Names (all prefixed ``tidegate_``):

=========================================  =========  ===============================
name                                       type       labels
=========================================  =========  ===============================
turns_total                                counter    trigger, status
turn_duration_seconds                      histogram  trigger
model_calls_total                          counter    provider, model, error_class
model_call_duration_seconds                histogram  provider, model
model_tokens_total                         counter    provider, model, kind (input, output, cache_read)
model_cost_usd_total                       counter    provider, model
lane_queue_depth                           gauge      -
lanes_active                               gauge      kind (main, cron, subagent)
channel_connected                          gauge      channel (1 connected, 0 not)
channel_reconnects_total                   counter    channel (from the adapters' status)
inbound_messages_total                     counter    channel, outcome (queued, denied, ...)
outbox_depth                               gauge      -
cron_runs_total                            counter    status
heartbeat_outcomes_total                   counter    outcome
timeline_append_duration_seconds           histogram  -
=========================================  =========  ===============================

``error_class`` is ``none`` for a successful call, else the provider error's class.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    def __init__(self, gw: Any) -> None:
        self.gw = gw
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.turns = Counter("tidegate_turns", "Turns by trigger and status",
                             ["trigger", "status"], registry=r)
        self.turn_seconds = Histogram("tidegate_turn_duration_seconds", "Turn duration",
                                      ["trigger"], buckets=_LATENCY, registry=r)
        self.calls = Counter("tidegate_model_calls", "Model calls",
                             ["provider", "model", "error_class"], registry=r)
        self.call_seconds = Histogram("tidegate_model_call_duration_seconds",
                                      "Model call duration (successful calls)",
                                      ["provider", "model"], buckets=_LATENCY, registry=r)
        self.tokens = Counter("tidegate_model_tokens", "Tokens by kind",
                              ["provider", "model", "kind"], registry=r)
        self.cost = Counter("tidegate_model_cost_usd", "Cost in USD (pricing)",
                            ["provider", "model"], registry=r)
        self.inbound = Counter("tidegate_inbound_messages", "Inbound platform messages",
                               ["channel", "outcome"], registry=r)
        self.cron_runs = Counter("tidegate_cron_runs", "Cron runs by status", ["status"],
                                 registry=r)
        self.beats = Counter("tidegate_heartbeat_outcomes", "Heartbeat outcomes",
                             ["outcome"], registry=r)
        self.timeline_seconds = Histogram("tidegate_timeline_append_duration_seconds",
                                          "Timeline append latency",
                                          buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                   0.05, 0.1, 0.25, 1), registry=r)
        r.register(_LiveCollector(gw))
        self._children: dict[tuple, Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept: every turn feeds ~8 labelled children and
        prometheus-client validates, stringifies and locks on each lookup. Children are
        never removed here, so a kept one is the one ``labels`` returns."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def attach(self) -> None:
        """Subscribe to the gateway's sources (call once the gateway is built)."""
        gw = self.gw
        gw.bus.subscribe(self.on_event, deltas=False)  # no text deltas: turns need not stream
        gw.usage.on_cost.append(self.on_cost)
        gw.intake.on_inbound = lambda ch, outcome: self.inbound.labels(ch, outcome).inc()
        sched = gw.scheduling
        sched.heartbeat.on_outcome.append(lambda o: self.beats.labels(o.outcome).inc())
        if sched.cron is not None:
            sched.cron.on_run_end.append(lambda _job, status: self.cron_runs.labels(
                status).inc())
        if gw.timeline_hooks is not None:
            gw.timeline_hooks.on_append = self.timeline_seconds.observe

    def on_event(self, ev: Any) -> None:
        d = ev.data
        if ev.type == "agent_end":
            trigger = str(d.get("trigger") or "user")
            self._child(self.turns, trigger, str(d.get("status"))).inc()
            self._child(self.turn_seconds, trigger).observe(float(d.get("duration_ms") or 0) / 1000)
        elif ev.type == "message_end":
            provider, model = str(d.get("provider") or "echo"), str(d.get("model") or "")
            self._child(self.calls, provider, model, "none").inc()
            self._child(self.call_seconds, provider, model).observe(
                float(d.get("model_ms") or 0) / 1000)
        elif ev.type == "model_error":
            provider, _, model = str(d.get("model") or "").partition("/")
            self.calls.labels(provider, model, str(d.get("error_class"))).inc()

    def on_cost(self, provider: str, model: str, usage: dict[str, Any], cost: float) -> None:
        for kind, key in (("input", "input"), ("output", "output"),
                          ("cache_read", "cacheRead")):
            self._child(self.tokens, provider, model, kind).inc(int(usage.get(key) or 0))
        self._child(self.cost, provider, model).inc(cost)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LiveCollector:
    """Gauges read from the gateway at scrape time."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        gw = self.gw
        stats = gw.lanes.stats()
        yield GaugeMetricFamily("tidegate_lane_queue_depth", "Queued lane items",
                                value=stats.get("queued", 0))
        active = GaugeMetricFamily("tidegate_lanes_active", "Running turns by lane kind",
                                   labels=["kind"])
        for kind in stats.get("caps", {}):
            active.add_metric([kind], stats.get("running", {}).get(kind, 0))
        yield active
        connected = GaugeMetricFamily("tidegate_channel_connected",
                                      "1 when the channel is connected", labels=["channel"])
        reconnects = CounterMetricFamily("tidegate_channel_reconnects",
                                         "Reconnects reported by the adapter",
                                         labels=["channel"])
        for name, st in gw.channel_status().items():
            if st.get("state") == "disabled":
                continue
            connected.add_metric([name], 1.0 if st.get("state") == "connected" else 0.0)
            reconnects.add_metric([name], float(st.get("reconnects") or 0))
        yield connected
        yield reconnects
        yield GaugeMetricFamily("tidegate_outbox_depth", "Replies waiting in the outbox",
                                value=gw.outbox.pending())


def metrics_routes(gw: Any) -> list[web.RouteDef]:
    """``GET /metrics``: the gateway token, or none with ``metrics.public_loopback``."""
    from gateway.server.control_api import bearer_ok

    async def metrics(request: web.Request) -> web.Response:
        if not gw.config.metrics.public_loopback and not bearer_ok(request, gw.token):
            return web.json_response({"ok": False, "error": "unauthorized"}, status=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        return web.Response(body=gw.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE})

    return [web.get("/metrics", metrics)]
