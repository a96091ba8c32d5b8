"""An OTLP receiver that accepts connections but never answers (a wedged collector, a
black-holing proxy: here a local listening socket that never replies) neither holds the
gateway's stop for the export timeout of every batch, nor fills the log with the SDK's
warning per retry: the stop waits at most CLOSE_TIMEOUT_S for telemetry, and the outage
is one warning of ours."""

from __future__ import annotations

import io
import json
import logging
import socket
import time

import pytest
from structlog.testing import capture_logs

from gateway.logs.pipeline import configure_logging, reset_logging
from gateway.telemetry.service import CLOSE_TIMEOUT_S
from runtime import telemetry
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]


@pytest.fixture
def mute():
    """A port that accepts (the kernel's backlog) and never answers."""
    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


async def test_a_receiver_that_never_answers_does_not_hold_the_stop(tmp_path, model, mute):
    for n in range(3):
        model.script_text(f"reply {n}")
    cfg = base_config(tmp_path / "state", model.base_url,
                      telemetry={"otlp": {"endpoint": mute, "timeout": "10s",
                                          "interval": "30s"}})
    with capture_logs() as logs:
        async with running_gateway(cfg) as gw:
            assert telemetry.enabled()
            for n in range(3):
                await gw.local.send(f"hello {n}", to="ann")
            started = time.monotonic()  # the spans wait in the batch: the stop sends them
        took = time.monotonic() - started
    assert took < CLOSE_TIMEOUT_S + 2.5, took
    assert not telemetry.enabled()
    assert [e for e in logs if e["event"] == "telemetry_close_timed_out"]


def test_the_sdk_retry_warnings_are_held_back(tmp_path):
    stream = io.StringIO()
    configure_logging(state_dir=None, stream=stream, fmt="json")
    try:
        sdk = logging.getLogger("opentelemetry.exporter.otlp.common.http")
        sdk.warning("Transient error %s encountered while exporting span batch", "x")
        sdk.error("Failed to export span batch due to timeout, max retries or shutdown.")
    finally:
        reset_logging()
    assert stream.getvalue() == ""
    assert logging.getLogger("opentelemetry").level == logging.NOTSET  # reset restores


def test_an_outage_is_one_warning_of_ours():
    from opentelemetry.sdk.trace.export import SpanExportResult

    from runtime.telemetry.watch import WatchedExporter

    class Receiver:  # the SDK's exporter interface, answering as told
        def __init__(self):
            self.results = [SpanExportResult.FAILURE] * 3 + [SpanExportResult.SUCCESS]

        def export(self, spans):
            return self.results.pop(0)

    watched = WatchedExporter(Receiver(), "http://collector:4318")
    with capture_logs() as logs:
        results = [watched.export([object()]) for _ in range(4)]
    assert results[-1] is SpanExportResult.SUCCESS
    events = [(e["event"], e["log_level"]) for e in logs]
    assert events == [("telemetry_spans_export_failed", "warning"),
                      ("telemetry_spans_export_recovered", "info")]
    assert json.dumps(logs[1]["dropped"]) == "3"

