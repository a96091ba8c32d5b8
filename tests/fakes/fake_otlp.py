"""A local OTLP/HTTP receiver (``POST /v1/traces``, ``POST /v1/metrics``) that decodes
the protobuf bodies with ``opentelemetry-proto`` the way a collector does.

``spans``: every received span as a dict (``name``, ``trace_id``/``span_id``/``parent``
as hex, ``kind``, ``attributes`` {key: python value}, ``start``/``end`` epoch ns,
``status`` code, ``resource`` attributes); ``metrics``: {name: [data point dicts]}
(``attributes`` and ``value`` or ``count``/``sum``/``bucket_counts``); ``headers``: the
lower-cased headers of each request. Runs in its own thread (``start_in_thread``).
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from typing import Any

from aiohttp import web


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.metrics: dict[str, list[dict[str, Any]]] = {}
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    async def _body(self, request: web.Request) -> bytes:
        data = await request.read()
        with self.lock:
            self.headers.append({k.lower(): v for k, v in request.headers.items()})
        return gzip.decompress(data) if request.headers.get("Content-Encoding") == "gzip" \
            else data

    async def _traces(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
        req = ts.ExportTraceServiceRequest.FromString(await self._body(request))
        got = []
        for rs in req.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append({"name": s.name, "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent": s.parent_span_id.hex() or None,
                                "attributes": _attrs(s.attributes),
                                "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                                "status": s.status.code, "resource": resource,
                                "links": [lk.span_id.hex() for lk in s.links]})
        with self.lock:
            self.spans += got
        return web.Response(body=ts.ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def _metrics(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as ms
        req = ms.ExportMetricsServiceRequest.FromString(await self._body(request))
        got: dict[str, list[dict[str, Any]]] = {}
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    points = []
                    for p in getattr(m, kind).data_points:
                        point = {"attributes": _attrs(p.attributes), "kind": kind}
                        if kind == "histogram":
                            point.update(count=p.count, sum=p.sum,
                                         bucket_counts=list(p.bucket_counts),
                                         bounds=list(p.explicit_bounds))
                        else:
                            point["value"] = p.as_double if p.WhichOneof("value") == \
                                "as_double" else p.as_int
                        points.append(point)
                    got.setdefault(m.name, []).extend(points)
        with self.lock:
            for k, v in got.items():
                self.metrics.setdefault(k, []).extend(v)
        return web.Response(body=ms.ExportMetricsServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        app.router.add_post("/v1/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def start_in_thread(self) -> OtlpReceiver:
        loop = self._loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._start())
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())  # type: ignore[union-attr]
            loop.close()
        threading.Thread(target=run, name="otlp-receiver", daemon=True).start()
        if not started.wait(10):
            raise RuntimeError("the OTLP receiver did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def traces(self) -> dict[str, list[dict[str, Any]]]:
        """The spans received so far, by trace id."""
        out: dict[str, list[dict[str, Any]]] = {}
        with self.lock:
            for s in self.spans:
                out.setdefault(s["trace_id"], []).append(s)
        return out
