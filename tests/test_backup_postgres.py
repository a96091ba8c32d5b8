"""Backups on PostgreSQL storage: `backup create` snapshots the schema (one REPEATABLE READ
transaction, a binary COPY per table) plus the local files while the gateway serves;
`backup verify` decodes every COPY file and verifies the timeline chains without a
database; `backup restore` refuses a database that is not empty and loads an empty one,
and a gateway started on the restored database and state dir has every session,
transcript, cron job and pairing."""

from __future__ import annotations

import io
import json
import tarfile
import threading

import pytest

from tests.helpers import GatewayProcess
from tests.storage_backends import pg_query
from tests.test_backup_e2e import ok, slack_texts, tg_texts, tidegate
from tests.test_gateway_channels import (  # noqa: F401 - the platforms fixture
    TG_USER,
    control,
    platforms,
    three_channel_config,
    wait,
)

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")]


def pg_config(state, dsn, model, tg, slack, dc) -> dict:
    cfg = three_channel_config(state, model, tg, slack, dc)
    cfg["channels"]["telegram"]["dm_policy"] = "pairing"
    cfg["storage"] = {"backend": "postgres", "dsn": dsn}
    return cfg


def serve_once(gp, tg, slack, dc) -> None:
    """A pairing approved on Telegram, a cron job, and one turn on each platform."""
    tg.call(tg.fake.inject_message, "hello?", chat_id=TG_USER, user_id=TG_USER)
    notice = wait(lambda: tg_texts(tg), what="the pairing code")[0]
    ok(gp, "pairing", "approve", "telegram", notice.split("pairing code is ")[1].split(".")[0])
    ok(gp, "cron", "add", "--name", "standup", "--cron", "0 9 * * 1-5", "--message",
       "post the standup")
    tg.call(tg.fake.inject_message, "tg 0", chat_id=TG_USER, user_id=TG_USER)
    control(slack.url, "event", {"kind": "dm", "text": "slack 0"})
    control(dc.url, "dm", {"text": "discord 0"})
    wait(lambda: "echo: tg 0" in tg_texts(tg) and "echo: slack 0" in slack_texts(slack)
         and any("echo: discord 0" in str(m) for m in dc.fake.chat_view(
             dc.fake.dm_channels.get(dc.fake.alice.id, "none"))), what="the three replies")


def transcripts(dsn: str) -> dict[str, list[str]]:
    """Every transcript in the database: session id -> its lines, in order."""
    out: dict[str, list[str]] = {}
    for sid, line in pg_query(dsn, "SELECT session_id, line FROM transcript_lines "
                                   "ORDER BY session_id, seq"):
        out.setdefault(sid, []).append(line)
    return out


def test_backup_of_postgres_storage_restores_into_a_working_gateway(
        tmp_path, platforms, pg_server):  # noqa: F811
    model, tg, slack, dc = platforms
    dsn = pg_server.create_database()
    gp = GatewayProcess(tmp_path, pg_config(tmp_path / "state", dsn, model, tg, slack, dc))
    gp.start()
    archive = tmp_path / "pg.tar.gz"
    try:
        serve_once(gp, tg, slack, dc)
        before = json.loads(ok(gp, "sessions", "list", "--json"))
        stop, sent = threading.Event(), []

        def flow() -> None:  # turns keep flowing while the snapshot is taken
            while not stop.is_set() and len(sent) < 4:
                sent.append(f"during {len(sent)}")
                control(slack.url, "event", {"kind": "dm", "text": sent[-1]})
                stop.wait(0.05)
        flowing = threading.Thread(target=flow)
        flowing.start()
        try:
            out = ok(gp, "backup", "create", "--to", str(archive))
        finally:
            stop.set()
            flowing.join()
        assert "backup written" in out
        wait(lambda: all(f"echo: {t}" in slack_texts(slack) for t in sent),
             what="the replies to the turns during the backup")
        status = json.loads(ok(gp, "status", "--json"))
        assert status["backup"]["ok"] is True and status["backup"]["file"] == str(archive)
        verified = json.loads(ok(gp, "backup", "verify", str(archive), "--json"))
        assert verified["ok"] and verified["timeline_sessions"] == 3
        # create and verify count the same files (the state files and each table's COPY)
        assert f"{verified['files']} files" in out and verified["files"] > 10
        assert verified["timeline_events"] > 10
    finally:
        assert gp.stop() == 0
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        names = tar.getnames()
    assert manifest["storage"] == "postgres" and manifest["timeline"]["db"] == "postgres"
    tables = {t["name"]: t for t in manifest["postgres"]["tables"]}
    assert {"sessions", "timelines", "timeline_events", "transcript_lines", "cron_jobs",
            "pairing"} <= set(tables)
    assert not {"tidegate_migrations", "cluster_leases", "cluster_replicas"} & set(tables)
    assert tables["transcript_lines"]["partitioned"] and tables["sessions"]["rows"] == 3
    assert f"postgres/{'timeline_events'}.copy" in names
    assert not any(n.startswith("state/") and n.endswith(".jsonl") and "/sessions/" in n
                   for n in names)  # transcripts live in the database, not on disk
    final = transcripts(dsn)
    assert len(final) == 3

    # a flipped byte in one COPY file fails verification, naming the file
    tampered = tmp_path / "tampered.tar.gz"
    _rewrite(archive, tampered, "postgres/timeline_events.copy", flip=200)
    code, _, err = tidegate(gp, "backup", "verify", str(tampered))
    assert code == 1 and "postgres/timeline_events.copy: SHA-256" in err

    # the database still holds the schema: restore refuses it and writes nothing
    refused = tmp_path / "refused"
    code, _, err = tidegate(gp, "backup", "restore", str(archive), "--state-dir",
                            str(refused), "--dsn", dsn)
    assert code == 2 and "is not empty (it has" in err and not refused.exists()

    # a backup made with a migration this build does not ship: refused before writing
    alien = tmp_path / "alien.tar.gz"
    _rewrite(archive, alien, "MANIFEST.json", edit=lambda m: m["postgres"]["migrations"]
             .append({"version": 9999, "name": "from_the_future", "checksum": "0" * 64}))
    code, _, err = tidegate(gp, "backup", "restore", str(alien), "--state-dir",
                            str(refused), "--dsn", pg_server.create_database())
    assert code == 2 and "9999_from_the_future is missing from this tidegate build" in err
    assert not refused.exists()

    target_dsn = pg_server.create_database()
    restored = tmp_path / "restored"
    out = ok(gp, "backup", "restore", str(archive), "--state-dir", str(restored),
             "--dsn", target_dsn)
    assert "restore OK" in out and "storage.dsn: postgresql://" in out
    (tmp_path / "r").mkdir()
    gp2 = GatewayProcess(tmp_path / "r", pg_config(restored, target_dsn, model, tg, slack, dc))
    gp2.start()
    try:
        after = {s["session_key"]: s["session_id"] for s in
                 json.loads(ok(gp2, "sessions", "list", "--json"))}
        assert {s["session_key"]: s["session_id"] for s in before}.items() <= after.items()
        got = transcripts(target_dsn)
        assert set(got) == set(final)
        for sid, lines in got.items():  # a prefix of what was served (then maybe more)
            n = min(len(lines), len(final[sid]))
            assert lines[:n] == final[sid][:n] and n >= 3, sid
        assert [j["name"] for j in json.loads(ok(gp2, "cron", "list", "--json"))] == ["standup"]
        # --channel: without it `pairing list` looks for the embedded store's files
        approved = json.loads(ok(gp2, "pairing", "list", "--approved", "--channel",
                                 "telegram", "--json"))
        assert [a["sender_id"] for a in approved] == [str(TG_USER)]
        assert "OK: 3 sessions" in ok(gp2, "timeline", "verify")
        tg.call(tg.fake.inject_message, "back again", chat_id=TG_USER, user_id=TG_USER)
        wait(lambda: "echo: back again" in [m["text"] for m in tg.call(
            tg.fake.bot_messages, TG_USER)], what="a reply without pairing")
    finally:
        assert gp2.stop() == 0
    # the sequences were set: the next timeline sorts after every restored one
    (last, called), = pg_query(target_dsn, "SELECT last_value, is_called FROM "
                                           "timelines_created_order_seq")
    assert called and last == pg_query(target_dsn, "SELECT max(created_order) FROM "
                                                   "timelines")[0][0] == 3


def _rewrite(src, dest, member: str, *, flip: int = 0, edit=None) -> None:
    """Copy the archive ``src`` to ``dest`` with one byte of ``member`` flipped, or (with
    ``edit``) its JSON changed in place by ``edit(obj)``."""
    with tarfile.open(src) as tin, tarfile.open(dest, "w:gz") as tout:
        for info in tin.getmembers():
            data = bytearray(tin.extractfile(info).read())
            if info.name == member and edit is not None:
                obj = json.loads(data)
                edit(obj)
                data = bytearray(json.dumps(obj).encode())
                info.size = len(data)
            elif info.name == member:
                data[flip] ^= 0x01
            tout.addfile(info, io.BytesIO(bytes(data)))
