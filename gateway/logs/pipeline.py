"""Structured logging: one pipeline for our events and third-party library logs.

Every line of ``<state_dir>/logs/gateway.jsonl`` is one JSON object with ``ts`` (RFC 3339
UTC, ms, ``Z``), ``level``, ``event``, ``logger``, the bound context (``session_key``,
``run_id``, ``channel``, ``agent``, ``job_id`` via :mod:`structlog.contextvars`) and the
event's keyword arguments (DESIGN.md "Operations"). The same events go to stderr: console
rendering on a TTY, JSON otherwise (systemd/journald).

Library records (aiohttp, httpx, telegram, discord, slack_sdk, openai, apscheduler) come
through stdlib :mod:`logging` and ``ProcessorFormatter`` into the same handlers, with the
same keys and the same redaction; our own events are written to those handlers directly
(``sink.py``: rendered once, no ``LogRecord``). Redaction runs on every value
(nested containers and exception tracebacks included): for our events inside structlog's
chain, before the record reaches any stdlib handler; for library records in the
formatter's pre-chain.

Usage::

    configure_logging(state_dir=Path("~/.tidegate").expanduser(), secrets=[token])
    log = structlog.get_logger(__name__)
    with structlog.contextvars.bound_contextvars(session_key=key, run_id=run_id):
        log.info("turn_start", model="gpt-4o")
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import structlog
from structlog.stdlib import ProcessorFormatter

from gateway.logs.outage import OutageTracebacks
from gateway.logs.redact import REDACTED, Redactor, find_secrets  # noqa: F401 - re-exported
from gateway.logs.sink import LineSink, Outputs
from runtime.clock import utc_iso

LOG_FILE_NAME = "gateway.jsonl"
DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_BACKUPS = 5
# Context keys bound with structlog.contextvars; the log reader shows them first.
CONTEXT_KEYS = ("session_key", "run_id", "channel", "agent", "job_id")
# Chatty libraries held at WARNING: httpx logs every request URL at INFO, and Telegram's
# URLs carry the bot token (/bot<token>/getUpdates).
NOISY_LOGGERS = (
    "httpx", "httpcore", "aiohttp", "telegram", "discord", "slack_sdk", "slack_bolt",
    "openai", "anthropic", "apscheduler", "urllib3", "websockets", "hpack", "bm25s",
)
# Libraries whose own warnings repeat for every retry of one outage: held at ERROR+ (all
# but CRITICAL dropped) unless logging.level is debug; tidegate logs the outage once
# itself (runtime/telemetry/watch.py, gateway/telemetry/service.py).
QUIET_LOGGERS = ("opentelemetry",)
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}
_FORMATS = ("auto", "console", "json")

# --- timestamps -----------------------------------------------------------------------

format_ts = utc_iso  # RFC 3339 UTC with ms; the per-second prefix is cached


def _add_ts(_logger: Any, _method: str, event_dict: dict) -> dict:
    event_dict["ts"] = format_ts(time.time())
    return event_dict


def _add_logger_name(logger: Any, _method: str, event_dict: dict) -> dict:
    # Like structlog.stdlib.add_logger_name, but a final logger without a name (structlog's
    # PrintLogger, left behind when another configuration swapped the factory but not the
    # processors) must not turn every log call into an AttributeError.
    event_dict["logger"] = getattr(logger, "name", None) or "tidegate"
    return event_dict


def _add_ts_from_record(_logger: Any, _method: str, event_dict: dict) -> dict:
    record = event_dict.get("_record")
    event_dict["ts"] = format_ts(record.created if record is not None else time.time())
    return event_dict


def _render_json(_logger: Any, _method: str, event_dict: dict) -> str:
    ordered = {"ts": event_dict.pop("ts", None), "level": event_dict.pop("level", None),
               "event": event_dict.pop("event", None)}
    ordered.update(event_dict)
    return json.dumps(ordered, ensure_ascii=False, separators=(",", ":"), default=str)


def _json_line(event_dict: dict) -> str:
    return _render_json(None, "", event_dict)


def _to_sink(_logger: Any, _method: str, event_dict: dict) -> tuple[tuple[dict], dict]:
    """The chain's last step: the event dict itself goes to :class:`LineSink`."""
    return (event_dict,), {}


class _CachingFormatter(ProcessorFormatter):
    """ProcessorFormatter that renders a record once: RotatingFileHandler formats each
    record twice (size check + write) and file and stderr share the JSON formatter."""

    def format(self, record: logging.LogRecord) -> str:
        cached = record.__dict__.get("_tidegate_rendered")
        if cached is not None and cached[0] is self:
            return cached[1]
        line = super().format(record)
        record.__dict__["_tidegate_rendered"] = (self, line)
        return line


class _RotatingFile(logging.handlers.RotatingFileHandler):
    """RotatingFileHandler whose size check costs one lseek: the stdlib version stats the
    path twice, seeks and formats the record again for every line."""

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        if self.maxBytes <= 0:
            return False
        if self.stream is None:
            self.stream = self._open()
        return self.stream.tell() + len(self.format(record)) + 1 > self.maxBytes


# --- configuration ----------------------------------------------------------------------

@dataclass
class _State:
    redactor: Redactor = field(default_factory=Redactor)
    handlers: list[logging.Handler] = field(default_factory=list)
    outputs: Outputs = field(default_factory=list)  # our events: (handler, renderer)
    file_path: Path | None = None


_STATE = _State()


def _formatter(renderer: Any, foreign_chain: list) -> _CachingFormatter:
    return _CachingFormatter(
        foreign_pre_chain=foreign_chain,
        processors=[ProcessorFormatter.remove_processors_meta, renderer],
    )


def configure_logging(*, state_dir: Path | None, level: str = "info", fmt: str = "auto",
                      secrets: Iterable[str] = (), max_bytes: int = DEFAULT_MAX_BYTES,
                      backups: int = DEFAULT_BACKUPS, stream: TextIO | None = None,
                      library_level: str = "warning") -> None:
    """Set up structlog + stdlib logging for the whole process (DESIGN.md "Operations").

    ``state_dir``: JSON lines go to ``<state_dir>/logs/gateway.jsonl`` (directory created
    with mode 0700), rotated at ``max_bytes`` bytes keeping ``backups`` old files; None logs
    to the stream only. ``level``: debug | info | warning | error (case-insensitive);
    structlog loggers drop events below it before any processing. ``fmt``: auto (console
    when ``stream`` is a TTY, else JSON) | console | json, for the stream only — the file is
    always JSON. ``stream`` defaults to the current ``sys.stderr``. ``secrets`` are added to
    the redaction set (see :func:`update_secrets`). ``library_level`` is the floor for the
    chatty third-party loggers in :data:`NOISY_LOGGERS`.

    Idempotent: a second call replaces the handlers installed by the first (closing its
    file). Raises ValueError for an unknown level/format or negative sizes.
    """
    lvl = _parse_level(level, "logging.level")
    lib_lvl = _parse_level(library_level, "library_level")
    if fmt not in _FORMATS:
        raise ValueError(f"logging.format: must be one of {', '.join(_FORMATS)} (got {fmt!r})")
    if max_bytes < 0 or backups < 0:
        raise ValueError("logging.max_bytes and logging.backups must be >= 0")
    stream = sys.stderr if stream is None else stream
    _STATE.redactor.add(secrets)

    _drop_handlers()
    # Third-party records: same keys, same redaction, applied by the formatter.
    foreign_chain = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        _add_ts_from_record,
        structlog.processors.format_exc_info,
        _STATE.redactor,
    ]
    json_fmt = _formatter(_render_json, foreign_chain)
    outputs: Outputs = []
    if state_dir is not None:
        outputs.append(_file_output(Path(state_dir), max_bytes, backups, json_fmt))
    outputs.append(_stream_output(stream, fmt, json_fmt, foreign_chain))
    _install_handlers([h for h, _ in outputs], lvl, lib_lvl)
    _STATE.outputs = outputs
    _configure_structlog(lvl)


def _file_output(state_dir: Path, max_bytes: int, backups: int,
                 json_fmt: _CachingFormatter) -> tuple[logging.Handler, Any]:
    """The rotating JSON-lines file ``<state_dir>/logs/gateway.jsonl`` (directory mode
    0700) and its renderer."""
    log_dir = state_dir.expanduser() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = log_dir / LOG_FILE_NAME
    fh = _RotatingFile(
        path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8",
        errors="backslashreplace")
    fh.setFormatter(json_fmt)
    _STATE.file_path = path
    return fh, _json_line


def _stream_output(stream: TextIO, fmt: str, json_fmt: _CachingFormatter,
                   foreign_chain: list) -> tuple[logging.Handler, Any]:
    """The stream's handler and renderer: console (``fmt`` console, or auto on a TTY) or
    JSON lines."""
    sh = logging.StreamHandler(stream)
    if fmt == "console" or (fmt == "auto" and _isatty(stream)):
        renderer = structlog.dev.ConsoleRenderer(colors=_isatty(stream), timestamp_key="ts")
        sh.setFormatter(_formatter(renderer, foreign_chain))
        return sh, lambda event_dict: renderer(None, "", event_dict)
    sh.setFormatter(json_fmt)
    return sh, _json_line


def _install_handlers(handlers: list[logging.Handler], lvl: int, lib_lvl: int) -> None:
    """Put ``handlers`` on the root logger at ``lvl``; the noisy libraries get at least
    ``lib_lvl``."""
    root = logging.getLogger()
    quiet = OutageTracebacks()  # a handler filter: library records only reach handlers
    for h in handlers:
        h.addFilter(quiet)
        root.addHandler(h)
    root.setLevel(lvl)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(max(lvl, lib_lvl))
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(lvl if lvl <= logging.DEBUG else logging.CRITICAL)
    logging.captureWarnings(True)
    _STATE.handlers = handlers


class _CurrentStderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a line is written (like logging's
    ``lastResort``), shared by every unconfigured writer, so their lines never interleave
    and never race on the stream object."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


_UNCONFIGURED_STDERR = _CurrentStderr()


def _warning_line(event_dict: dict) -> str | None:
    """Unconfigured rendering: WARNING and above as JSON lines; the rest dropped."""
    if LEVELS.get(str(event_dict.get("level", "")), logging.WARNING) < logging.WARNING:
        return None
    return _json_line(event_dict)


def _configure_unconfigured() -> None:
    """The state before :func:`configure_logging` and after :func:`reset_logging`: our
    chain (redaction included) with every level passed on, but only WARNING and above
    written, to stderr. Never structlog's default PrintLogger: it prints every event to
    whatever ``sys.stdout`` is (a one-shot command's output, or another thread's
    redirected buffer), under a lock no other writer of that stream takes."""
    _STATE.outputs = [(_UNCONFIGURED_STDERR, _warning_line)]
    _configure_structlog(logging.NOTSET)


def _configure_structlog(lvl: int) -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            _add_logger_name,
            _add_ts,
            structlog.processors.StackInfoRenderer(),
            # Traceback -> "exception" text, then redaction, before the event leaves
            # structlog: any handler on the root logger only ever sees redacted values.
            structlog.processors.format_exc_info,
            _STATE.redactor,
            _to_sink,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=_sink_factory,
        context_class=dict,
        # Not cached so that a reconfigure (new level on SIGHUP) reaches module-level
        # loggers too; costs ~2 us per call.
        cache_logger_on_first_use=False,
    )


def _sink_factory(name: str | None = None, *_args: Any) -> LineSink:
    return LineSink(name or "tidegate", lambda: _STATE.outputs)


def update_secrets(secrets: Iterable[str]) -> None:
    """Add secrets to the redaction set (e.g. after a SIGHUP config reload). Strings
    shorter than 6 characters are ignored; secrets are never removed."""
    _STATE.redactor.add(secrets)


def redact(text: str) -> str:
    """Redact a string with the process-wide secret set (for error texts shown outside
    the log, e.g. in control API responses)."""
    return _STATE.redactor.redact(text)


def get_logger(name: str | None = None) -> Any:
    """``structlog.get_logger(name)``: a lazy logger honouring the current configuration."""
    return structlog.get_logger(name)


def log_file_path() -> Path | None:
    """Where the current configuration writes JSON lines (None without a state dir)."""
    return _STATE.file_path


def close_logging() -> None:
    """Flush and close the log file handlers (stderr stays, so late shutdown messages are
    still rendered and redacted). Safe to call more than once."""
    _drop_handlers(files_only=True)


def reset_logging() -> None:
    """Undo :func:`configure_logging`: remove and close our handlers, restore the root and
    library logger levels; structlog is left unconfigured (WARNING and above to stderr,
    see :func:`_configure_unconfigured`) for tests and one-shot CLI commands."""
    _drop_handlers()
    logging.getLogger().setLevel(logging.WARNING)
    for name in (*NOISY_LOGGERS, *QUIET_LOGGERS):
        logging.getLogger(name).setLevel(logging.NOTSET)
    logging.captureWarnings(False)
    _configure_unconfigured()


def _drop_handlers(files_only: bool = False) -> None:
    root, keep = logging.getLogger(), []
    for h in _STATE.handlers:
        h.flush()
        if files_only and not isinstance(h, logging.FileHandler):
            keep.append(h)
            continue
        root.removeHandler(h)
        h.close()
    _STATE.handlers = keep
    _STATE.outputs = [(h, render) for h, render in _STATE.outputs if h in keep]
    _STATE.file_path = None


def _parse_level(level: str, what: str) -> int:
    lvl = LEVELS.get(str(level).lower())
    if lvl is None:
        raise ValueError(f"{what}: must be one of {', '.join(LEVELS)} (got {level!r})")
    return lvl


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
