"""A lane taken again by a replica that ran it before: the session's transcript is read
from PostgreSQL, not from the log this replica kept from its earlier holding. A replica
whose beats were late forgets the lanes it held and their cached logs
(gateway/cluster/work.py ``lane_lost``); a turn of the lane already queued there still
runs and opens the log again. When that lane later ran on another replica and then came
back, the turn used the old log: its model request lacked the messages the other replica
had answered meanwhile (a forked prompt), and its transcript write conflicted. Seen with
bench/cluster_checker.py (``lost-history``, after a PostgreSQL outage). Two gateway
replicas in-process on a real PostgreSQL, the fake model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.config.load import parse_config
from gateway.service.daemon import Gateway
from tests.channel_harness import until
from tests.helpers import base_config

pytestmark = pytest.mark.timeout(60)
KEY = "agent:main:cli:dm:u1"


def _config(tmp: Path, name: str, dsn: str, model) -> dict:
    cfg = base_config(tmp / name / "state", model.base_url,
                      storage={"backend": "postgres", "dsn": dsn},
                      cluster={"lease_ttl": "3s", "replica_id": name})
    cfg["gateway"]["shutdown_grace"] = "0.5s"
    cfg["cron"] = {"enabled": False}
    return cfg


def _users(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m.get("role") == "user"
            and isinstance(m.get("content"), str)]


def _chats(model) -> list[dict]:
    return [r.json for r in model.requests if r.path.endswith("/chat/completions")]


async def test_a_lane_taken_back_reads_what_the_other_replica_wrote(tmp_path, pg_dsn, model):
    a = Gateway(parse_config(_config(tmp_path, "a", pg_dsn, model), "test", env={}))
    b = Gateway(parse_config(_config(tmp_path, "b", pg_dsn, model), "test", env={}))
    await a.start()
    await b.start()
    try:
        model.script_text("a1")
        await a.local.send("m1", session_key=KEY)  # A runs the lane
        model.script_text("a2", delay=1.0)
        model.script_text("a3")
        t2 = asyncio.create_task(a.local.send("m2", session_key=KEY))
        await until(lambda: len(_chats(model)) == 2, what="m2 in the model on A")
        t3 = asyncio.create_task(a.local.send("m3", session_key=KEY))
        await until(lambda: a.lanes.stats()["queued"] == 1, what="m3 queued on A")
        a.cluster.work.lane_lost(KEY)  # A's beats were late: it forgets the lane
        await t2
        await t3  # ... but m3, already queued there, runs and opens the log again
        await until(lambda: not a.lanes.is_busy(KEY), what="A idle")
        await a.cluster.work.release_idle()  # nobody took it: the lease is given back
        model.script_text("a4")
        await b.local.send("m4", session_key=KEY)  # B takes the lane and answers m4
        assert _users(_chats(model)[-1]) == ["m1", "m2", "m3", "m4"]
        await b.cluster.work.release_idle()
        b.cluster.work.idle_release = 0.0
        await b.cluster.work.release_idle()  # B gives the lane back
        model.script_text("a5")
        await a.local.send("m5", session_key=KEY)  # A takes it again
        assert _users(_chats(model)[-1]) == ["m1", "m2", "m3", "m4", "m5"]
    finally:
        await b.stop()
        await a.stop()
