"""Span status: the root span of a failed turn and a failed ``tool.call`` are status
ERROR with ``error.type`` (a class, never an error's message), against the local OTLP
receiver that decodes the protobuf (tests/fakes/fake_otlp.py)."""

from __future__ import annotations

import json

import pytest

from tests.channel_harness import until
from tests.fakes.fake_otlp import OtlpReceiver
from tests.helpers import base_config, running_gateway

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]


async def test_a_failed_turn_and_a_failed_tool_call_have_status_error(tmp_path, model):
    receiver = OtlpReceiver().start_in_thread()
    try:
        (tmp_path / "state" / "workspace").mkdir(parents=True)
        model.script_tool_call("read", {"path": "no-such-file.md"})
        model.script_error(400, message="the secret prompt was rejected",
                           error_type="invalid_request_error")
        cfg = base_config(tmp_path / "state", model.base_url, telemetry={
            "otlp": {"endpoint": receiver.url, "interval": "0.1s"}})
        async with running_gateway(cfg) as gw:
            await gw.local.send("read it", to="ann")
            done = lambda: [t for t in receiver.traces().values()
                            if {"turn", "tool.call"} <= {s["name"] for s in t}]
            [spans] = await until(done, what="the failed turn's trace")
    finally:
        receiver.stop()
    by_name = {s["name"]: s for s in spans}
    root, tool = by_name["turn"], by_name["tool.call"]
    assert root["attributes"]["tidegate.turn.status"] == "error"
    assert root["status"] == 2 and root["attributes"]["error.type"]  # STATUS_CODE_ERROR
    assert "secret" not in json.dumps(root["attributes"])
    assert tool["attributes"]["tidegate.tool.is_error"] is True
    assert tool["status"] == 2 and tool["attributes"]["error.type"] == "tool_error"
