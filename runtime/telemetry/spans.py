"""The tracing hooks the turn path calls, and what they cost when tracing is off.

Off (the default), :data:`_state` is None and every hook returns the shared
:data:`NOOP` context manager, whose span accepts attributes and drops them: one global
read and one comparison per hook, nothing of OpenTelemetry imported. On,
``runtime/telemetry/setup.py`` installs a :class:`Tracing` and the hooks make spans:

- :func:`turn` (the lane, around one turn): the root ``turn`` span of a new trace (never
  a child of whatever ran before in the lane's task), started when the first of its
  messages was queued, with a ``lane.queue`` child covering the wait for the lane.
- :func:`span` (``model.attempt``, ``tool.call``, ``platform.send``): a child of the
  current span.
- :func:`inject`: W3C ``traceparent`` (and ``tracestate``) of the current span added to
  outgoing HTTP headers (OpenAI-compatible providers).

Attributes are names, counts, timings and outcomes; message text, tool arguments and
session keys are added only by :func:`content` when ``telemetry.include_content`` is
true. An exception leaving a span marks it as an error with ``error.type`` (the class
name); its message is never recorded (it can quote a request).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any


class _NoopSpan:
    """Stands in for a span while tracing is off: takes attributes and drops them."""

    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attrs: dict[str, Any]) -> None:
        pass

    def is_recording(self) -> bool:
        return False


NOOP_SPAN = _NoopSpan()
NOOP = contextlib.nullcontext(NOOP_SPAN)
_state: Tracing | None = None


def enabled() -> bool:
    """True while a tracer is installed."""
    return _state is not None


def turn(kind: str, queued_ns: int, messages: int, key: str = "") -> Any:
    """The root span of one turn (context manager yielding it): ``kind`` the lane kind
    (main | cron | subagent), ``queued_ns`` when its first message was queued (epoch ns,
    ``time.time_ns()``), ``messages`` how many queued messages it runs, ``key`` the
    session key (an attribute only with ``include_content``: it holds user ids)."""
    st = _state
    return NOOP if st is None else st.turn(kind, queued_ns, messages, key)


def span(name: str, attrs: dict[str, Any]) -> Any:
    """A child span of the current one (context manager yielding it)."""
    st = _state
    return NOOP if st is None else st.span(name, attrs)


def content(sp: Any, attrs: dict[str, Any]) -> None:
    """Add ``attrs`` (message text, arguments, keys; non-strings as JSON, cut at 4,000
    chars) to
    ``sp`` only when ``telemetry.include_content`` is true."""
    st = _state
    if st is not None and st.include_content and sp.is_recording():
        sp.set_attributes({k: _text(v)[:4000] for k, v in attrs.items() if v is not None})


def _text(value: Any) -> str:
    """A content attribute's value: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def annotate(attrs: dict[str, Any]) -> None:
    """Set ``attrs`` on the current span (the turn's outcome on its root)."""
    st = _state
    if st is not None:
        st.annotate(attrs)


def fail(kind: str, sp: Any = None) -> None:
    """Mark ``sp`` (default: the current span, the turn's root at its end) as failed:
    status ERROR and ``error.type`` ``kind`` (a class such as ``timeout`` or
    ``tool_error``, never an error's message: it can quote a request)."""
    st = _state
    if st is not None:
        st.fail(kind, sp)


def inject(headers: dict[str, str] | None) -> dict[str, str] | None:
    """``headers`` plus the current span's ``traceparent`` (a new dict); unchanged when
    tracing is off or no span is current."""
    st = _state
    return headers if st is None else st.inject(headers)


class Tracing:
    """The hooks' implementation over an OpenTelemetry ``tracer``."""

    def __init__(self, tracer: Any, *, include_content: bool) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )
        self.tracer, self.include_content = tracer, include_content
        self._trace, self._context = trace, context
        self._propagator = TraceContextTextMapPropagator()

    @contextlib.contextmanager
    def turn(self, kind: str, queued_ns: int, messages: int, key: str) -> Iterator[Any]:
        trace, ctx_mod = self._trace, self._context
        before = trace.get_current_span()
        links = [trace.Link(before.get_span_context())] \
            if before.get_span_context().is_valid else None
        root = self.tracer.start_span(
            "turn", context=ctx_mod.Context(), start_time=queued_ns or None, links=links,
            attributes={"tidegate.lane.kind": kind, "tidegate.turn.messages": messages})
        if self.include_content and key:
            root.set_attribute("tidegate.session_key", key)
        ctx = trace.set_span_in_context(root, ctx_mod.Context())
        self.tracer.start_span("lane.queue", context=ctx, start_time=queued_ns or None,
                               attributes={"tidegate.lane.kind": kind}).end()
        token = ctx_mod.attach(ctx)
        try:
            yield root
        except BaseException as exc:
            _failed(root, exc)
            raise
        finally:
            ctx_mod.detach(token)
            root.end()

    @contextlib.contextmanager
    def span(self, name: str, attrs: dict[str, Any]) -> Iterator[Any]:
        with self.tracer.start_as_current_span(name, attributes=attrs,
                                               record_exception=False,
                                               set_status_on_exception=False) as sp:
            try:
                yield sp
            except BaseException as exc:
                _failed(sp, exc)
                raise

    def annotate(self, attrs: dict[str, Any]) -> None:
        sp = self._trace.get_current_span()
        if sp.is_recording():
            sp.set_attributes({k: v for k, v in attrs.items() if v is not None})

    def fail(self, kind: str, sp: Any) -> None:
        from opentelemetry.trace import Status, StatusCode
        sp = self._trace.get_current_span() if sp is None else sp
        if sp.is_recording():
            sp.set_attribute("error.type", kind)
            sp.set_status(Status(StatusCode.ERROR, kind))

    def inject(self, headers: dict[str, str] | None) -> dict[str, str] | None:
        if not self._trace.get_current_span().get_span_context().is_valid:
            return headers
        out = dict(headers or {})
        self._propagator.inject(out)
        return out


def _failed(sp: Any, exc: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode
    kind = getattr(exc, "error_class", None) or type(exc).__name__
    sp.set_attribute("error.type", str(kind))
    sp.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def install(tracing: Tracing | None) -> None:
    """Make ``tracing`` the process's (None: tracing off again)."""
    global _state
    _state = tracing
