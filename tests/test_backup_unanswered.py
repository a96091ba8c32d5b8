"""``backup create`` with a gateway that is alive but does not answer (stopped with
SIGSTOP, wedged: here a port that accepts connections and never replies, under a live
pid) reads the files itself after a short health check instead of waiting minutes; and a
backup the gateway was asked for is finished even when its client gave up."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time

import yaml

from gateway.backup.check import verify_archive
from gateway.cli.backup import HELLO_TIMEOUT_S
from gateway.cli.main import main as cli
from tests.helpers import base_config, running_gateway


def test_a_gateway_that_does_not_answer_is_not_waited_for(tmp_path, capsys):
    state = tmp_path / "state"
    (state / "agents").mkdir(parents=True)
    (state / "agents" / "a.txt").write_text("a")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(base_config(state)))
    mute = socket.create_server(("127.0.0.1", 0))  # listens (the kernel accepts), no reply
    try:
        (state / "gateway.json").write_text(json.dumps(
            {"pid": os.getpid(), "port": mute.getsockname()[1], "bind": "127.0.0.1"}))
        dest = tmp_path / "b.tar.gz"
        started = time.monotonic()
        code = cli(["--config", str(cfg), "backup", "create", "--to", str(dest)])
        took = time.monotonic() - started
    finally:
        mute.close()
    err = capsys.readouterr().err
    assert code == 0, err
    assert took < HELLO_TIMEOUT_S + 5
    assert "note: the gateway does not answer" in err and "read here" in err
    assert verify_archive(dest).ok


async def test_a_backup_whose_client_gave_up_is_finished_whole(tmp_path):
    cfg = base_config(tmp_path / "state")
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "b.tar.gz"
    async with running_gateway(cfg) as gw:
        await gw.local.send("one", to="ann")
        port = json.loads((gw.state_dir / "gateway.json").read_text())["port"]
        token = (gw.state_dir / "gateway.token").read_text().strip()
        body = json.dumps({"to": str(dest)}).encode()
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /api/backup HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nAuthorization: Bearer " + token.encode() +
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()  # the client gives up before any answer
        last = gw.state_dir / "backup-last.json"
        for _ in range(400):  # the gateway goes on with the backup it accepted
            if last.exists():
                break
            await asyncio.sleep(0.025)
    assert json.loads(last.read_text())["ok"] is True
    assert sorted(p.name for p in out.iterdir()) == ["b.tar.gz"]  # no partial file
    assert verify_archive(dest).ok
