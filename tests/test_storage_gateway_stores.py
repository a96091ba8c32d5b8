"""The real gateway on PostgreSQL keeps every smaller store in the database (issue 15):
after a turn and a cron job, none of the embedded files (cron/jobs.json, outbox/,
channels/inbound-seen.jsonl, usage/, heartbeat/delivered.json, auth-state.json,
pairing/) exists, and the rows are in PostgreSQL. Two replicas share cron definitions:
a job added through one replica's CLI is listed by the other's control API, and a job
removed on the other is gone on the first."""

from __future__ import annotations

import json
import time

from tests.helpers import GatewayProcess, base_config
from tests.storage_backends import pg_query

EMBEDDED_FILES = ("cron/jobs.json", "cron/runs", "outbox", "channels/inbound-seen.jsonl",
                  "usage", "heartbeat/delivered.json", "auth-state.json", "pairing")


def _jobs(gp: GatewayProcess) -> list[str]:
    return [j["id"] for j in json.loads(gp.cli("cron", "list", "--json").stdout)]


def _until(pred, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_two_replicas_on_postgres_share_cron_jobs_and_write_no_store_files(
        tmp_path, fake_model, pg_dsn):
    storage = {"backend": "postgres", "dsn": pg_dsn}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = GatewayProcess(tmp_path / "a", base_config(tmp_path / "a" / "state",
                                                   fake_model.base_url, storage=storage))
    b = GatewayProcess(tmp_path / "b", base_config(tmp_path / "b" / "state",
                                                   fake_model.base_url, storage=storage))
    a.start()
    try:
        b.start()
        try:
            fake_model.server.script_text("hi")
            assert a.agent("hello")["reply"] == "hi"
            added = json.loads(a.cli("cron", "add", "--name", "digest", "--every", "1h",
                                     "--message", "send the digest", "--json").stdout)
            _until(lambda: added["id"] in _jobs(b), "replica b lists the job")
            b.cli("cron", "rm", added["id"])
            _until(lambda: added["id"] not in _jobs(a), "replica a drops the removed job")
        finally:
            assert b.stop() == 0
    finally:
        assert a.stop() == 0
    for gp in (a, b):
        present = [f for f in EMBEDDED_FILES if (gp.state_dir / f).exists()]
        assert present == [], f"embedded store files written on postgres: {present}"
    assert pg_query(pg_dsn, "SELECT job_id, removed FROM cron_jobs") == [(added["id"], True)]
    usage = pg_query(pg_dsn, "SELECT record FROM usage_records")
    assert len(usage) == 1 and json.loads(usage[0][0])["agent"] == "main"
