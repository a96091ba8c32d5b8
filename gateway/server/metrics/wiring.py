"""``GatewayMetrics``: the gateway's counters and histograms and the observers that feed
them (event bus, usage, intake, heartbeat, cron, timeline). Needs no prometheus-client:
``render`` imports the exposition at the first scrape."""

from __future__ import annotations

from functools import partial
from typing import Any

from gateway.server.metrics.counting import Counter, Histogram

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_APPEND = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class GatewayMetrics:
    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.turns = Counter("tidegate_turns", "Turns by trigger and status",
                             ("trigger", "status"))
        self.turn_seconds = Histogram("tidegate_turn_duration_seconds", "Turn duration",
                                      ("trigger",), buckets=_LATENCY)
        self.calls = Counter("tidegate_model_calls", "Model calls",
                             ("provider", "model", "error_class"))
        self.call_seconds = Histogram("tidegate_model_call_duration_seconds",
                                      "Model call duration (successful calls)",
                                      ("provider", "model"), buckets=_LATENCY)
        self.tokens = Counter("tidegate_model_tokens", "Tokens by kind",
                              ("provider", "model", "kind"))
        self.cost = Counter("tidegate_model_cost_usd", "Cost in USD (pricing)",
                            ("provider", "model"))
        self.inbound = Counter("tidegate_inbound_messages", "Inbound platform messages",
                               ("channel", "outcome"))
        self.cron_runs = Counter("tidegate_cron_runs", "Cron runs by status", ("status",))
        self.beats = Counter("tidegate_heartbeat_outcomes", "Heartbeat outcomes",
                             ("outcome",))
        self.outcomes = Counter("tidegate_message_outcomes", "Accepted messages by outcome",
                                ("outcome",))
        self.timeline_seconds = Histogram("tidegate_timeline_append_duration_seconds",
                                          "Timeline append latency", buckets=_APPEND)
        # the exposition order (then the gauges read at scrape time)
        self.families: tuple[Counter | Histogram, ...] = (
            self.turns, self.turn_seconds, self.calls, self.call_seconds, self.tokens,
            self.cost, self.inbound, self.outcomes, self.cron_runs, self.beats,
            self.timeline_seconds)
        self._registry: Any = None  # prometheus-client's, made at the first scrape

    def attach(self) -> None:
        """Subscribe to the gateway's sources (call once the gateway is built)."""
        gw = self.gw
        gw.bus.subscribe(self.on_event, deltas=False)  # no text deltas: turns need not stream
        gw.usage.on_cost.append(self.on_cost)
        gw.intake.on_inbound = lambda ch, outcome: self.inbound.inc((ch, outcome))
        gw.outcomes.on_outcome.append(lambda outcome: self.outcomes.inc((outcome,)))
        sched = gw.scheduling
        sched.heartbeat.on_outcome.append(lambda o: self.beats.inc((o.outcome,)))
        if sched.cron is not None:
            sched.cron.on_run_end.append(lambda _job, status: self.cron_runs.inc((status,)))
        if gw.timeline_hooks is not None:
            gw.timeline_hooks.on_append = partial(self.timeline_seconds.observe, ())

    def on_event(self, ev: Any) -> None:
        d = ev.data
        if ev.type == "agent_end":
            trigger = str(d.get("trigger") or "user")
            self.turns.inc((trigger, str(d.get("status"))))
            self.turn_seconds.observe((trigger,), float(d.get("duration_ms") or 0) / 1000)
        elif ev.type == "message_end":
            provider, model = str(d.get("provider") or "echo"), str(d.get("model") or "")
            self.calls.inc((provider, model, "none"))
            self.call_seconds.observe((provider, model), float(d.get("model_ms") or 0) / 1000)
        elif ev.type == "model_error":
            provider, _, model = str(d.get("model") or "").partition("/")
            self.calls.inc((provider, model, str(d.get("error_class"))))

    def on_cost(self, provider: str, model: str, usage: dict[str, Any], cost: float) -> None:
        for kind, key in (("input", "input"), ("output", "output"),
                          ("cache_read", "cacheRead")):
            self.tokens.inc((provider, model, kind), int(usage.get(key) or 0))
        self.cost.inc((provider, model), cost)

    def registry(self) -> Any:
        """The prometheus-client registry /metrics renders (made at the first use)."""
        from gateway.server.metrics.exposition import registry
        if self._registry is None:
            self._registry = registry(self.families, self.gw)
        return self._registry

    def render(self) -> bytes:
        """The text exposition (prometheus-client's ``generate_latest``) of the counted
        families and the gauges read from the gateway now."""
        from gateway.server.metrics.exposition import registry, render
        if self._registry is None:
            self._registry = registry(self.families, self.gw)
        return render(self._registry)
