"""Control API route for the control UI's logs view (bearer token required):

``GET /api/logs/stream?level=&event=&session=&channel=&lines=200`` answers with NDJSON:
the last ``lines`` (default 200, at most 2000) matching records of
``<state_dir>/logs/gateway.jsonl`` (rotated files included), then every new matching
record as the gateway writes it, until the client goes away. Each line is the log record
as written (already redacted: gateway.logs.pipeline); a line of the file that is not JSON comes as
``{"raw": "<text>"}``. Filters are those of ``tidegate logs`` (gateway/logs/records.py):
minimum ``level``; ``event``, ``session`` (key) and ``channel`` each exact or a prefix.
400 names a bad filter. The reading (and following, with rotation) is gateway/logs/reader.py's, run in
a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.server.control_api import require_token

MAX_LINES = 2000
_QUEUE_CAP = 10_000  # records waiting for a slow browser; beyond it they are dropped


class _LineSink:
    """A text stream for read_logs (a worker thread) that hands each line to the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        self.loop, self.queue, self._buf = loop, queue, ""

    def write(self, text: str) -> int:
        self._buf += text
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            if line:
                self.loop.call_soon_threadsafe(self._put, line)
        return len(text)

    def _put(self, line: str) -> None:
        if self.queue.qsize() < _QUEUE_CAP:
            self.queue.put_nowait(line)

    def flush(self) -> None:
        pass


def log_path(gw: Any) -> Path:
    """The gateway's JSON log file (where gateway.logs.pipeline writes it for this state dir)."""
    from gateway.logs.pipeline import LOG_FILE_NAME
    return gw.state_dir / "logs" / LOG_FILE_NAME


def _record(line: str) -> bytes:
    try:
        obj = json.loads(line)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        obj = {"raw": line.replace("\x00", "")}
    return json.dumps(obj, ensure_ascii=False, default=str).encode() + b"\n"


def logs_routes(gw: Any) -> list[web.RouteDef]:
    async def stream(request: web.Request) -> web.StreamResponse:
        """The last matching log records, then each new one as NDJSON
        (``?level=&event=&session=&channel=&lines=``; already redacted)."""
        from gateway.logs.reader import read_logs  # the log reader loads with its first use
        from gateway.logs.records import LogFilter
        q = request.query
        try:
            lines = min(MAX_LINES, max(0, int(q.get("lines", "200"))))
            LogFilter.build(q.get("level") or None, q.get("session"))  # validates level
        except ValueError as exc:
            return web.json_response({"ok": False, "error": str(exc).replace("--", "")},
                                     status=400)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str] = asyncio.Queue()
        stop = threading.Event()
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson",
                                           "Cache-Control": "no-store"})
        await resp.prepare(request)
        reader = asyncio.ensure_future(asyncio.to_thread(
            read_logs, log_path(gw), follow=True, as_json=True, lines=lines,
            level=q.get("level") or None, session=q.get("session"), event=q.get("event"),
            channel=q.get("channel"), out=_LineSink(loop, queue), stop=stop,
            poll_interval=0.2))
        try:
            while not reader.done() and not gw.stopping:
                try:
                    line = await asyncio.wait_for(queue.get(), 1.0)
                except TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        break
                    continue
                await resp.write(_record(line))
        except ConnectionResetError:
            pass  # the browser went away
        finally:
            stop.set()
        return resp

    return [web.get("/api/logs/stream", require_token(gw, stream))]
