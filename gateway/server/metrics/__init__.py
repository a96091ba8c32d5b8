"""Prometheus metrics (``GET /metrics``, text exposition format via prometheus-client).

Each gateway counts its own metrics. Counters and histograms are fed by the event bus
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
message_outcomes_total                     counter    outcome (replied, silent, refused, failed, interrupted, dead-lettered)
messages_without_outcome                   gauge      - (accepted, no outcome, older than the turn timeout, in no lane)
dead_letters                               gauge      -
cron_runs_total                            counter    status
heartbeat_outcomes_total                   counter    outcome
timeline_append_duration_seconds           histogram  -
=========================================  =========  ===============================

``error_class`` is ``none`` for a successful call, else the provider error's class.
Counters and histograms also have their ``_created`` series, as prometheus-client's own.

Rooms: ``counting`` (the counters and histograms, plain dicts), ``wiring`` (what feeds
them), ``exposition`` (prometheus-client's metric families and text format: imported at
the first scrape, so a gateway starts without prometheus-client, ~20 ms of import, issue 9),
``routes`` (the HTTP endpoint).
"""

from gateway.server.metrics.routes import CONTENT_TYPE, metrics_routes
from gateway.server.metrics.wiring import GatewayMetrics

__all__ = ["CONTENT_TYPE", "GatewayMetrics", "metrics_routes"]
