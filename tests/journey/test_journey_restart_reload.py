"""Stage: a broken edit never takes a healthy gateway down.

``gateway restart`` checks what the new process would load (its real environment, the env
file, every ``${VAR}``) before it stops anything; a refused SIGHUP reload is shown in
``status`` and ``/readyz`` until a reload succeeds; ``status`` answers from the running
gateway while an unrelated section of the file is invalid.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.request

from tests.journey.driver import wait_for
from tests.journey.steps import setup_telegram, start_as_printed


def _readyz(operator) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.port}/readyz", timeout=5) as r:
        assert r.status == 200
        return json.loads(r.read())


def test_a_broken_edit_keeps_the_old_gateway_serving_and_says_so(operator, telegram, model):
    fg = start_as_printed(operator, setup_telegram(operator, telegram, model))
    good = operator.config_path.read_text()

    # an edit that names a secret nobody set: the new process would exit 2
    operator.edit_config(lambda cfg: cfg["models"]["providers"]["openai"].update(
        api_key="${OPENAI_API_KEY_ROTATED}"))
    refused = operator.run("gateway", "restart")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "OPENAI_API_KEY_ROTATED is not set" in refused.stderr
    assert "the running gateway keeps serving" in refused.stderr
    assert fg.proc.poll() is None
    assert "echo: still here?" in operator.ok("agent", "-m", "still here?").stdout

    # the same file on SIGHUP: refused, and visible until a reload succeeds
    os.kill(fg.proc.pid, signal.SIGHUP)
    problem = wait_for(lambda: [p for p in _readyz(operator).get("problems", [])
                                if "reload at" in str(p)], what="the failed reload in /readyz")
    assert "still running the previous config" in str(problem)
    status = operator.run("status")
    assert status.returncode == 0, status.stderr
    assert "reload at" in status.stdout and "failed" in status.stdout
    assert "OPENAI_API_KEY_ROTATED" in status.stdout

    # an unrelated section broken in the file: status still answers from the gateway
    operator.edit_config(lambda cfg: cfg["channels"]["telegram"].update(dm_policy="sometimes"))
    status = operator.run("status")
    assert status.returncode == 0, status.stderr
    assert "gateway: running" in status.stdout and "is invalid" in status.stdout
    assert "channels.telegram.dm_policy" in status.stdout

    # a new port that another process listens on: the old gateway must not be stopped
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        operator.config_path.write_text(good)
        operator.edit_config(lambda cfg: cfg["gateway"].update(port=busy))
        moved = operator.run("gateway", "restart")
        assert moved.returncode == 2, moved.stdout + moved.stderr
        assert f"127.0.0.1:{busy} is in use" in moved.stderr
        assert fg.proc.poll() is None

    operator.config_path.write_text(good)
    reloaded = operator.run("gateway", "reload", timeout=60)  # a good reload says so at once
    assert reloaded.returncode == 0 and "reloaded gateway" in reloaded.stdout, \
        reloaded.stdout + reloaded.stderr
    assert "reload at" not in operator.ok("status").stdout
    restarted = operator.ok("gateway", "restart")
    assert "started gateway (pid" in restarted.stdout
    assert fg.proc.wait(30) == 0  # the old one drained and exited
    assert "echo: back" in operator.ok("agent", "-m", "back").stdout
    assert "reload at" not in operator.ok("status").stdout
