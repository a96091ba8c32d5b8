"""Run only by tests/test_harness.py in a child pytest: a test that starts a gateway,
records its pid in $PROBE_PID_FILE and fails without stopping it."""

import os
from pathlib import Path

from tests.helpers import GatewayProcess, base_config


def test_fails_with_its_gateway_running(tmp_path):
    gw = GatewayProcess(tmp_path, base_config(tmp_path / "state")).start()
    Path(os.environ["PROBE_PID_FILE"]).write_text(str(gw.proc.pid))
    raise AssertionError("failing on purpose, gateway left running")
