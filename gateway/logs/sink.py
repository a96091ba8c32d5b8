"""Where our own structlog events are written: straight to the log file and the stream.

Library records (aiohttp, telegram, ...) reach the same handlers through stdlib
:mod:`logging` and ``ProcessorFormatter``. Our events skip that detour: it built two
``LogRecord`` objects per event (one per formatter pass), looked up the caller's frame
and took the logging module's locks twice — about 100 µs of CPU per line, two lines per
turn (issue 9, CPU per turn). Here an event is rendered once per output kind (the JSON
line is shared by the file and a non-TTY stream) and written under each handler's own
lock, so the bytes, the rotation and the order of lines are what the handlers produce
for library records.
"""

from __future__ import annotations

import logging
import logging.handlers
from collections.abc import Callable

# (handler, renderer) pairs: a renderer turns an event dict into one line (no newline), or
# None to leave this output out.
Outputs = list[tuple[logging.Handler, Callable[[dict], str | None]]]
_UNRENDERED = object()


class LineSink:
    """structlog's final logger (``logger_factory`` product): every level method renders
    the event dict the processor chain handed over and writes it to ``outputs()``.

    ``name`` is the logger's name (``structlog.stdlib.add_logger_name`` reads it).
    ``outputs`` is read at every event, so closing the file (``close_logging``) or a
    reconfiguration reaches loggers bound earlier."""

    def __init__(self, name: str, outputs: Callable[[], Outputs]) -> None:
        self.name = name
        self._outputs = outputs

    def msg(self, event_dict: dict) -> None:
        rendered: dict[Callable[[dict], str | None], str | None] = {}
        for handler, render in self._outputs():
            line = rendered.get(render, _UNRENDERED)
            if line is _UNRENDERED:
                line = rendered[render] = render(dict(event_dict))
            if line is not None:  # a renderer returns None to drop the event
                write_line(handler, line, event_dict)

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def write_line(handler: logging.Handler, line: str, event_dict: dict) -> None:
    """Append ``line`` + newline as ``handler`` would: a rotating file rolls over first
    when the line would take it past ``maxBytes``; the stream is flushed. Write errors go
    to ``handler.handleError`` like any logging failure (never raised)."""
    with handler.lock or _NO_LOCK:
        try:
            if isinstance(handler, logging.handlers.RotatingFileHandler):
                if handler.stream is None:
                    handler.stream = handler._open()
                if 0 < handler.maxBytes < handler.stream.tell() + len(line) + 1:
                    handler.doRollover()
            stream = handler.stream
            stream.write(line + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging must never break the caller
            handler.handleError(logging.makeLogRecord(
                {"msg": str(event_dict.get("event")), "levelname": "ERROR"}))


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()
