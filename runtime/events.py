"""Runtime events of agent runs and their subscribers (seed 001 §event stream).

Event types: ``agent_start``, ``message_start``, ``message_update`` (text delta),
``message_end`` (with the round's model, provider, model_ms and usage), ``model_error``
(model, attempt, of, error, error_class, retry_in_s: None when not retried),
``tool_execution_start``, ``tool_execution_end``, ``tool_run_start`` (the tool's
handler is about to run: after its approval, if it needed one; tool, call_id),
``turn_tainted`` (a tool result brought untrusted content into the turn; why),
``auto_compaction_start``/``auto_compaction_end``, ``agent_end``. Subscribers are plain
callables; a failing subscriber is logged and never breaks the run. Per-run subscribers
(e.g. a streaming HTTP response) receive only their run's events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger(__name__)

EVENT_TYPES = frozenset({
    "agent_start", "message_start", "message_update", "message_end", "model_error",
    "tool_execution_start", "tool_execution_end", "tool_run_start", "turn_tainted",
    "auto_compaction_start",
    "auto_compaction_end", "agent_end",
})


@dataclass(slots=True)
class RuntimeEvent:
    """One event. ``ts`` is epoch seconds; ``data`` depends on ``type``."""

    type: str
    run_id: str
    session_key: str
    agent_id: str
    ts: float
    data: dict[str, Any] = field(default_factory=dict)


Subscriber = Callable[[RuntimeEvent], None]


class EventBus:
    """Fan-out of runtime events to global and per-run subscribers."""

    def __init__(self) -> None:
        self._global: list[Subscriber] = []
        self._global_deltas: list[Subscriber] = []
        self._per_run: dict[str, list[Subscriber]] = {}

    def subscribe(self, fn: Subscriber, run_id: str | None = None, *,
                  deltas: bool = True) -> Callable[[], None]:
        """Add a subscriber (for one run when ``run_id`` is given); returns unsubscribe.

        ``deltas=False`` says a global subscriber ignores ``message_update``: turns then
        call their model without streaming unless someone else consumes the deltas."""
        if run_id is None:
            self._global.append(fn)
            if deltas:
                self._global_deltas.append(fn)

            def unsubscribe_global() -> None:
                for subs in (self._global, self._global_deltas):
                    if fn in subs:
                        subs.remove(fn)
            return unsubscribe_global
        self._per_run.setdefault(run_id, []).append(fn)

        def unsubscribe() -> None:
            subs = self._per_run.get(run_id)
            if subs and fn in subs:
                subs.remove(fn)
                if not subs:
                    del self._per_run[run_id]
        return unsubscribe

    def wants_deltas(self, run_id: str) -> bool:
        """True when a subscriber would receive ``run_id``'s text deltas (so the model call
        should stream)."""
        return bool(self._global_deltas) or run_id in self._per_run

    def emit(self, event: RuntimeEvent) -> None:
        for fn in self._global:
            self._call(fn, event)
        subs = self._per_run.get(event.run_id)
        if subs:
            for fn in list(subs):
                self._call(fn, event)

    @staticmethod
    def _call(fn: Subscriber, event: RuntimeEvent) -> None:
        try:
            fn(event)
        except Exception:
            log.exception("event_subscriber_failed", event_type=event.type, run_id=event.run_id)
