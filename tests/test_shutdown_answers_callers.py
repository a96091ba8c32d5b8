"""A gateway that stops while local callers wait answers them before its HTTP server
closes (docs/openai-api.md, the error table): ``/v1/chat/completions`` with 503
``shutting_down`` and ``Retry-After: 1`` (an error event in a stream), the webchat page
with an ``error`` frame; each message's outcome is ``failed``."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway

pytestmark = pytest.mark.timeout(30)


async def test_stopping_gateway_answers_waiting_api_and_webchat_callers(tmp_path):
    async with FakeOpenAI() as fake:
        for _ in range(3):
            fake.script_hang()  # every turn still waits on the model when the stop comes
        cfg = base_config(tmp_path / "state", fake.base_url,
                          gateway={"shutdown_grace": "0.2s"})
        async with running_gateway(cfg) as gw:
            base = f"http://127.0.0.1:{gw.port}"
            auth = {"Authorization": f"Bearer {gw.token}"}
            async with aiohttp.ClientSession(headers=auth) as s:
                async def post(user: str, stream: bool) -> tuple[int, dict, str]:
                    body = {"model": "main", "user": user, "stream": stream,
                            "messages": [{"role": "user", "content": "hello"}]}
                    async with s.post(base + "/v1/chat/completions", json=body) as r:
                        return r.status, dict(r.headers), await r.text()

                plain = asyncio.ensure_future(post("plain", False))
                streamed = asyncio.ensure_future(post("streamed", True))
                ws = await s.ws_connect(f"{base}/ws?token={gw.token}&client=web1")
                await ws.send_json({"type": "message", "text": "hello"})
                async with asyncio.timeout(10):
                    while len(fake.requests) < 3:
                        await asyncio.sleep(0.01)
                await gw.stop()
                status, headers, text = await plain
                assert status == 503 and headers["Retry-After"] == "1"
                error = json.loads(text)["error"]
                assert (error["type"], error["code"]) == ("server_error", "shutting_down")
                assert headers["X-Session-Key"] == "agent:main:openai:dm:plain"
                status, _, text = await streamed
                events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
                assert status == 200 and events[-1] == "[DONE]"
                assert json.loads(events[-2])["error"]["code"] == "shutting_down"
                frames = []
                async with asyncio.timeout(5):
                    async for msg in ws:
                        frames.append(json.loads(msg.data))
                        if frames[-1]["type"] == "error":
                            break
                assert "shutting down" in frames[-1]["error"]
                await ws.close()
        rows = [(r["session_key"], r["outcome"]) for r in gw.journal.outcomes.select()]
        assert sorted(rows) == [("agent:main:openai:dm:plain", "failed"),
                                ("agent:main:openai:dm:streamed", "failed"),
                                ("agent:main:webchat:dm:web1", "failed")]


def test_sigterm_answers_a_waiting_api_caller_with_503(tmp_path):
    """The same through a real process and SIGTERM (what systemd and the operator send)."""
    import signal
    import threading
    import urllib.error
    import urllib.request

    from tests.helpers import GatewayProcess

    running = FakeOpenAI.start_in_thread()
    cfg = base_config(tmp_path / "state", running.base_url,
                      gateway={"shutdown_grace": "0.5s"})
    gp = GatewayProcess(tmp_path, cfg).start()
    got: dict = {}

    def call() -> None:
        body = json.dumps({"model": "main", "user": "st",
                           "messages": [{"role": "user", "content": "slow"}]}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{gp.port}/v1/chat/completions", body,
            {"Authorization": f"Bearer {gp.token}", "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30)
        except urllib.error.HTTPError as exc:
            got.update(status=exc.code, retry=exc.headers.get("Retry-After"),
                       error=json.loads(exc.read())["error"])
        except OSError as exc:  # dropped: no HTTP status at all
            got["dropped"] = exc

    try:
        running.server.script_hang()
        thread = threading.Thread(target=call)
        thread.start()
        deadline = time.monotonic() + 20
        while not [r for r in running.server.requests if r.path.endswith("/completions")]:
            assert time.monotonic() < deadline, "the turn never reached the model"
            time.sleep(0.05)
        gp.proc.send_signal(signal.SIGTERM)
        thread.join(30)
        assert gp.stop() == 0
    finally:
        if gp in GatewayProcess.live:
            gp.kill9()
        running.stop()
    assert "dropped" not in got, got
    assert (got["status"], got["retry"], got["error"]["code"]) == (503, "1", "shutting_down")
