"""OpenTelemetry export (telemetry.otlp): the real gateway in-process with the real
OpenTelemetry SDK and OTLP/HTTP exporter against a local receiver that decodes the
protobuf (tests/fakes/fake_otlp.py). A Telegram turn with one tool call is one trace:
the ``turn`` root with ``lane.queue``, two ``model.attempt`` spans, one ``tool.call`` and
one ``platform.send`` as its children; the model request carries the attempt's W3C
``traceparent``; no attribute holds message text, tool arguments or the session key; the
/metrics metrics arrive as OTLP metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime import telemetry
from runtime.telemetry.config import TelemetrySection
from tests.channel_harness import until
from tests.fakes.fake_otlp import OtlpReceiver
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]

USER = 4242
SECRET_TEXT = "my locker code is 7781"


@pytest.fixture
def receiver():
    r = OtlpReceiver().start_in_thread()
    yield r
    r.stop()


def config(tmp_path, model, tg, receiver, **extra: Any) -> dict:
    section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
               "poll_timeout": 1, "dm_policy": "open", "streaming": "off"}
    return base_config(tmp_path / "state", model.base_url, channels={"telegram": section},
                       telemetry={"otlp": {"endpoint": receiver.url, "interval": "0.1s"},
                                  **extra})


def _tree(spans: list[dict]) -> dict[str, Any]:
    [root] = [s for s in spans if s["parent"] is None]
    return {"root": root, "children": sorted(
        (s for s in spans if s["parent"] == root["span_id"]), key=lambda s: s["start"])}


async def test_a_turn_with_a_tool_call_is_one_trace(tmp_path, model, tg, receiver):
    (tmp_path / "state" / "workspace").mkdir(parents=True)
    model.script_tool_call("read", {"path": "AGENTS.md"})
    model.script_text("All done.")
    async with running_gateway(config(tmp_path, model, tg, receiver)) as gw:
        assert telemetry.enabled()
        tg.inject_message(SECRET_TEXT, chat_id=USER, user_id=USER)
        await until(lambda: tg.bot_messages(USER), what="the reply")
        done = lambda: [t for t in receiver.traces().values()
                        if {"turn", "platform.send"} <= {s["name"] for s in t}]
        [spans] = await until(done, what="the turn's trace at the receiver")
        gw_metrics = gw.telemetry
    assert not telemetry.enabled()  # uninstalled at stop
    tree = _tree(spans)
    root, children = tree["root"], tree["children"]
    assert root["name"] == "turn" and len(spans) == 1 + len(children)
    assert [c["name"] for c in children] == [
        "lane.queue", "model.attempt", "tool.call", "model.attempt", "platform.send"]
    assert root["start"] <= children[0]["start"] and children[-1]["end"] <= root["end"]
    assert root["attributes"] == {
        "tidegate.lane.kind": "main", "tidegate.turn.messages": 1, "tidegate.agent": "main",
        "tidegate.turn.trigger": "user", "tidegate.turn.status": "ok",
        "tidegate.turn.tool_calls": 1}
    first, tool, second, send = children[1:]
    assert first["attributes"]["gen_ai.system"] == "fake"
    assert first["attributes"]["gen_ai.request.model"] == "fake-model"
    assert first["attributes"]["gen_ai.usage.input_tokens"] > 0
    assert first["attributes"]["gen_ai.usage.output_tokens"] > 0
    assert first["attributes"]["tidegate.tool_calls"] == 1
    assert tool["attributes"]["tidegate.tool.name"] == "read"
    assert tool["attributes"]["tidegate.tool.is_error"] is False
    assert send["attributes"] == {"tidegate.channel": "telegram", "tidegate.send.kind":
                                  "reply", "tidegate.send.ok": True, "tidegate.send.parts": 1}
    assert root["resource"]["service.name"] == "tidegate"
    # W3C trace context on each model request: this trace, that attempt's span
    sent = [r.headers.get("traceparent", "") for r in model.requests
            if r.path.endswith("/chat/completions")]
    assert [s[:-1] for s in sent] == [f"00-{root['trace_id']}-{a['span_id']}-0"
                                      for a in (first, second)]
    assert all(int(s[-2:], 16) & 1 for s in sent)  # the sampled flag
    # no message text, tool argument or session key in any attribute
    blob = json.dumps([s["attributes"] for s in spans])
    for private in (SECRET_TEXT, "locker", "All done", "AGENTS.md", str(USER)):
        assert private not in blob
    # the /metrics metrics, exported once more at stop
    assert gw_metrics.exports >= 1
    turns = receiver.metrics["tidegate_turns"]
    assert {"attributes": {"trigger": "user", "status": "ok"}, "kind": "sum",
            "value": 1.0} in turns
    [hist] = [p for p in receiver.metrics["tidegate_turn_duration_seconds"]
              if p["attributes"] == {"trigger": "user"}][-1:]
    assert hist["count"] == 1 and sum(hist["bucket_counts"]) == 1


async def test_a_streamed_reply_has_its_platform_send_span(tmp_path, model, tg, receiver):
    """Streaming (the default in DMs): the final edit of the streamed reply is the turn's
    ``platform.send`` span, with the text only because include_content is on."""
    model.script_text("A streamed answer.")
    cfg = config(tmp_path, model, tg, receiver, include_content=True)
    cfg["channels"]["telegram"]["streaming"] = "partial"
    async with running_gateway(cfg):
        tg.inject_message("hello", chat_id=USER, user_id=USER)
        done = lambda: [t for t in receiver.traces().values()
                        if {"turn", "platform.send"} <= {s["name"] for s in t}]
        [spans] = await until(done, what="the streamed turn's trace at the receiver")
    [send] = [s for s in spans if s["name"] == "platform.send"]
    [root] = [s for s in spans if s["parent"] is None]
    assert send["parent"] == root["span_id"]
    assert send["attributes"] == {
        "tidegate.channel": "telegram", "tidegate.send.kind": "reply",
        "tidegate.send.streamed": True, "tidegate.send.ok": True, "tidegate.send.parts": 1,
        "tidegate.send.text": "A streamed answer."}
    assert any("A streamed answer." in str(s["payload"].get("text")) for s in tg.sent)


def test_content_attributes_only_when_asked():
    """include_content adds tool arguments and the sent text; by default they stay out."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from runtime.telemetry.spans import Tracing, install
    seen = {}
    for include in (False, True):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        install(Tracing(provider.get_tracer("t"), include_content=include))
        try:
            with telemetry.turn("main", 0, 1, "agent:main:telegram:dm:42"), \
                    telemetry.span("tool.call", {}) as sp:
                telemetry.content(sp, {"tidegate.tool.arguments": {"path": "x.md"}})
        finally:
            install(None)
        seen[include] = {s.name: dict(s.attributes) for s in exporter.get_finished_spans()}
    assert "tidegate.tool.arguments" not in seen[False]["tool.call"]
    assert "tidegate.session_key" not in seen[False]["turn"]
    assert seen[True]["turn"]["tidegate.session_key"] == "agent:main:telegram:dm:42"
    assert json.loads(seen[True]["tool.call"]["tidegate.tool.arguments"]) == {"path": "x.md"}
    with telemetry.span("tool.call", {}) as sp:  # off: the shared no-op span
        assert sp is telemetry.NOOP_SPAN and telemetry.inject(None) is None


def test_config_names_the_bad_key():
    with pytest.raises(ValueError, match="endpoint"):
        TelemetrySection.model_validate({"otlp": {"endpoint": "collector:4318"}})
    with pytest.raises(ValueError, match="sample_ratio"):
        TelemetrySection.model_validate({"otlp": {"endpoint": "http://c:4318",
                                                  "sample_ratio": 2}})


GRPC_RUN = r"""
import json
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tsg

from runtime import telemetry
from runtime.telemetry.config import TelemetrySection
from runtime.telemetry.setup import start

got = []


class Traces(tsg.TraceServiceServicer):
    def Export(self, request, context):
        got.append((dict(context.invocation_metadata()).get("x-api-key", ""),
                    {s.name: s.parent_span_id.hex() for rs in request.resource_spans
                     for ss in rs.scope_spans for s in ss.spans}))
        return ts.ExportTraceServiceResponse()


server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
tsg.add_TraceServiceServicer_to_server(Traces(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
try:
    cfg = TelemetrySection.model_validate({"otlp": {
        "endpoint": f"http://127.0.0.1:{port}", "protocol": "grpc",
        "headers": {"X-Api-Key": "k1"}}})
    exporting = start(cfg, version="0", instance="t")
    with telemetry.turn("cron", 0, 1), telemetry.span("model.attempt", {}):
        pass
    exporting.provider.force_flush()
    exporting.shutdown()
finally:
    server.stop(None)
print(json.dumps({"enabled_after": telemetry.enabled(), "got": got}))
"""


def test_grpc_protocol_exports_to_a_grpc_receiver():
    """protocol: grpc sends the spans over OTLP/gRPC (a real grpc server decoding them).
    In a child interpreter: grpc's threads and fork handlers must not live on in a test
    worker that later forks gateway subprocesses (a worker crashed in one CI run)."""
    out = subprocess.run([sys.executable, "-c", GRPC_RUN], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["enabled_after"] is False
    [(key, spans)] = result["got"]
    assert key == "k1" and set(spans) == {"turn", "lane.queue", "model.attempt"}
    assert spans["turn"] == "" and spans["lane.queue"] == spans["model.attempt"] != ""
