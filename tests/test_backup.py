"""Verified backups (gateway/backup): what goes in, what stays out, how verify and
restore find damage, and the scheduled backup with rotation in status, doctor and
/metrics. The end-to-end proof with three platforms is tests/test_backup_e2e.py."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import yaml

from gateway.backup.archive import create_backup
from gateway.backup.check import restore, verify_archive
from gateway.cli.main import main as cli
from runtime.clock import FakeClock
from tests.helpers import base_config, running_gateway

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def write_config(tmp: Path, cfg: dict) -> Path:
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}


def repack(archive: Path, dest: Path, change) -> None:
    """Rewrite ``archive`` to ``dest`` with ``change(name, data) -> data`` applied."""
    with tarfile.open(archive, "r:gz") as src, tarfile.open(dest, "w:gz") as out:
        for m in src:
            data = change(m.name, src.extractfile(m).read())
            m.size = len(data)
            out.addfile(m, io.BytesIO(data))


@pytest.fixture
async def served(tmp_path):
    """A gateway (echo model) that ran 3 turns in two sessions; its events are still in
    the timeline's pending log (committed to SQLite only every few minutes)."""
    cfg = base_config(tmp_path / "state")
    async with running_gateway(cfg) as gw:
        for text, to in (("one", "ann"), ("two", "bob"), ("three", "ann")):
            await gw.local.send(text, to=to)
        await gw.timeline_hooks.flush()  # queued events acknowledged (in the pending log)
        yield gw, cfg


async def test_a_backup_holds_the_pending_timeline_and_verifies(served, tmp_path):
    gw, _ = served
    state = gw.state_dir
    pending = (state / "timeline.db-pending").read_bytes()
    assert pending  # acknowledged events the database does not have yet
    made = create_backup(state, tmp_path / "b.tar.gz", timeline_db=state / "timeline.db")
    assert os.stat(made.path).st_mode & 0o777 == 0o600
    files = members(made.path)
    assert files["state/timeline.db-pending"] == pending
    manifest = json.loads(files["MANIFEST.json"])
    live = {t.session_id: (t.event_count, t.last_hash) for t in await gw.timeline_hooks
            .timeline.store.timelines()}
    assert {s: (h["seq"], h["hash"]) for s, h in manifest["timeline"]["heads"].items()} == live
    assert "gateway.token" in manifest["secrets_left_out"]
    assert not any(n.endswith(("gateway.lock", "gateway.json", "-journal")) for n in files)
    sessions = [f for f in manifest["files"] if f["path"].endswith(".jsonl")
                and "/sessions/" in f["path"]]
    assert len(sessions) == 2
    out = verify_archive(made.path)
    assert out.ok, out.problems
    assert (out.sessions, out.databases) == (2, 2) and out.events == manifest["timeline"][
        "events"]


async def test_secrets_stay_out_unless_asked_and_a_torn_line_is_cut(served, tmp_path, capsys):
    gw, cfg = served
    state = gw.state_dir
    (state / "tidegate.env").write_text("OPENAI_API_KEY=sk-live-123\n")
    (state / "config.yaml").write_text("models:\n  providers:\n    x:\n      api_key: sk-lit\n")
    (state / "config.lkg.yaml").write_text("models:\n  api_key: ${OPENAI_API_KEY}\n")
    transcript = next((state / "agents/main/sessions").glob("*.jsonl"))
    whole = transcript.read_bytes()
    transcript.write_bytes(whole + b'{"type":"message","id":"torn')  # a line being written
    path = write_config(tmp_path, cfg)
    # the running gateway makes it (the CLI waits for its control API: not on its loop)
    assert await asyncio.to_thread(cli, ["--config", str(path), "backup", "create", "--to",
                                         str(tmp_path / "a.tgz")]) == 0
    out = capsys.readouterr().out
    assert "secrets left out: config.yaml, gateway.token, tidegate.env" in out
    files = members(tmp_path / "a.tgz")
    assert "state/tidegate.env" not in files and "state/config.yaml" not in files
    assert "state/config.lkg.yaml" in files  # ${VAR} references only
    assert files[f"state/{transcript.relative_to(state).as_posix()}"] == whole
    assert await asyncio.to_thread(cli, ["--config", str(path), "backup", "create",
                                         "--include-secrets", "--to",
                                         str(tmp_path / "s.tgz")]) == 0
    assert "CONTAINS SECRETS" in capsys.readouterr().out
    files = members(tmp_path / "s.tgz")
    assert files["state/tidegate.env"] == b"OPENAI_API_KEY=sk-live-123\n"
    assert json.loads(files["MANIFEST.json"])["secrets"] is True
    assert os.stat(tmp_path / "s.tgz").st_mode & 0o777 == 0o600


async def test_verify_names_the_first_problem(served, tmp_path, capsys):
    gw, cfg = served
    made = create_backup(gw.state_dir, tmp_path / "b.tgz",
                         timeline_db=gw.state_dir / "timeline.db")
    path = write_config(tmp_path, cfg)
    # a changed file under an unchanged manifest
    repack(made.path, tmp_path / "t1.tgz", lambda n, d: d.replace(b'"text":"two"',
                                                                  b'"text":"TWO"'))
    assert cli(["--config", str(path), "backup", "verify", str(tmp_path / "t1.tgz")]) == 1
    assert "does not match the manifest" in capsys.readouterr().err
    # a forged timeline event whose file hash was updated in the manifest too: the chain
    # check still finds it
    stage = tmp_path / "stage"
    assert restore(made.path, stage).ok
    pend = (stage / "timeline.db-pending").read_bytes()
    forged = pend.replace(b"two", b"TWO", 1)  # the USER_INPUT event's text
    assert forged != pend

    def change(name: str, data: bytes) -> bytes:
        if name == "state/timeline.db-pending":
            return forged
        if name == "MANIFEST.json":
            import hashlib
            m = json.loads(data)
            for f in m["files"]:
                if f["path"] == "timeline.db-pending":
                    f["size"], f["sha256"] = len(forged), hashlib.sha256(forged).hexdigest()
            return json.dumps(m).encode()
        return data
    repack(made.path, tmp_path / "t2.tgz", change)
    out = verify_archive(tmp_path / "t2.tgz")
    assert not out.ok and "timeline chain broken: hash mismatch" in out.problems[0]
    # not an archive at all
    (tmp_path / "junk.tgz").write_bytes(b"\x1f\x8b" + os.urandom(200))
    assert "the archive is damaged" in verify_archive(tmp_path / "junk.tgz").problems[0]


async def test_restore_only_into_an_empty_dir_then_a_gateway_starts_there(served, tmp_path,
                                                                          capsys):
    gw, cfg = served
    made = create_backup(gw.state_dir, tmp_path / "b.tgz",
                         timeline_db=gw.state_dir / "timeline.db")
    path = write_config(tmp_path, cfg)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    assert cli(["--config", str(path), "backup", "restore", str(made.path), "--state-dir",
                str(busy)]) == 2
    assert "is not an empty directory" in capsys.readouterr().err
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    target = tmp_path / "restored"
    assert cli(["--config", str(path), "backup", "restore", str(made.path), "--state-dir",
                str(target)]) == 0
    assert "restore OK" in capsys.readouterr().out
    assert os.stat(target).st_mode & 0o777 == 0o700
    async with running_gateway(base_config(target)) as gw2:
        keys = {(e.session_key, e.session_id) for a in gw2.agents.values()
                for e in a.store.entries()}
        assert keys == {(e.session_key, e.session_id) for a in gw.agents.values()
                        for e in a.store.entries()}
        assert (await gw2.timeline_hooks.timeline.store.verify()).ok
        ann = gw2.agents["main"].store.get("agent:main:cli:dm:ann")
        transcript = target / "agents/main/sessions" / f"{ann.session_id}.jsonl"
        before = transcript.read_bytes()
        reply = await gw2.local.send("four", to="ann")
        assert "You said: four" in reply.text
        after = transcript.read_bytes()  # the restored session goes on in its transcript
        assert after.startswith(before) and b"You said: four" in after[len(before):]


async def test_scheduled_backups_rotate_and_show_in_status_doctor_metrics(tmp_path, capsys):
    clock = FakeClock(T0)
    cfg = base_config(tmp_path / "state", backup={"schedule": "*/10 * * * *", "keep": 2})
    async with running_gateway(cfg, clock=clock) as gw:
        await gw.local.send("hello")
        (gw.state_dir / "backups").mkdir()
        (gw.state_dir / "backups" / "mine.tar.gz").write_bytes(b"not ours: never rotated")
        assert await gw.backup.run_once() is not None  # by hand: never rotated either
        for _ in range(3):
            gw.backup.ran.clear()
            await clock.advance(600)
            await gw.backup.ran.wait()
        kept = sorted(p.name for p in (gw.state_dir / "backups").iterdir())
        assert kept == ["mine.tar.gz", "tidegate-backup-20260101T000000Z-manual.tar.gz",
                        "tidegate-backup-20260101T002000Z.tar.gz",
                        "tidegate-backup-20260101T003000Z.tar.gz"]
        status = gw.status()["backup"]
        assert status["ok"] is True and status["last_at"] == "2026-01-01T00:30:00.000Z"
        assert status["next_at"] == "2026-01-01T00:40:00.000Z"
        await clock.advance(90)
        text = gw.metrics.render().decode()
        assert "tidegate_backup_last_success 1.0" in text
        assert "tidegate_backup_last_age_seconds 90.0" in text
        assert verify_archive(gw.state_dir / "backups" / kept[-1]).ok
    path = write_config(tmp_path, cfg)
    from gateway.cli.doctor import check_backup
    from gateway.config.load import load_config
    loaded = load_config(str(path))
    ctx = {"state_dir": loaded.state_dir, "loaded": loaded, "now": T0 + 35 * 60}
    [f] = check_backup(ctx)
    assert f.severity == "ok" and "tidegate-backup-20260101T003000Z" in f.message
    ctx["now"] += 3600  # five slots missed
    [f] = check_backup(ctx)
    assert f.severity == "warning" and "overdue" in f.message


def test_a_bad_schedule_is_a_config_error_naming_the_key(tmp_path, capsys):
    path = write_config(tmp_path, base_config(tmp_path / "s", backup={"schedule": "61 * * * *"}))
    assert cli(["--config", str(path), "backup", "create"]) == 2
    assert "backup.schedule" in capsys.readouterr().err


async def test_a_failed_scheduled_backup_is_recorded_and_the_next_slot_runs(tmp_path):
    """An OSError (here: the backup dir cannot be made) is a recorded failed backup: the
    record, a status problem, the metric at 0, one ERROR log line; the schedule goes on."""
    from structlog.testing import capture_logs
    clock = FakeClock(T0)
    blocker = tmp_path / "afile"
    blocker.write_text("a file where the backup dir's parent should be")
    cfg = base_config(tmp_path / "state", backup={"schedule": "*/10 * * * *",
                                                  "dir": str(blocker / "backups")})
    async with running_gateway(cfg, clock=clock) as gw:
        with capture_logs() as logs:
            gw.backup.ran.clear()
            await clock.advance(600)
            await gw.backup.ran.wait()
        last = json.loads((gw.state_dir / "backup-last.json").read_text())
        assert last["ok"] is False and "Not a directory" in last["error"]
        assert [e["event"] for e in logs if e["log_level"] == "error"] == ["backup_failed"]
        assert any("last scheduled backup failed" in p for p in gw.status()["problems"])
        assert "tidegate_backup_last_success 0.0" in gw.metrics.render().decode()
        blocker.unlink()  # the operator fixes it: the next slot backs up again
        gw.backup.ran.clear()
        await clock.advance(600)
        await gw.backup.ran.wait()
        last = json.loads((gw.state_dir / "backup-last.json").read_text())
        assert last["ok"] is True and Path(last["file"]).parent == blocker / "backups"
        assert gw.status()["backup"]["next_at"] == "2026-01-01T00:30:00.000Z"


def test_cli_create_into_an_impossible_place_exits_1_and_records_it(tmp_path, capsys):
    path = write_config(tmp_path, base_config(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "sessions.json").write_text("{}")
    assert cli(["--config", str(path), "backup", "create", "--to",
                "/proc/nope/x.tar.gz"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: backup failed: /proc/nope") and "Traceback" not in err
    last = json.loads((tmp_path / "state" / "backup-last.json").read_text())
    assert last["ok"] is False and "/proc/nope" in last["error"]


async def test_a_custom_timeline_path_beside_a_stray_state_dir_copy(tmp_path, capsys):
    """timeline.path outside the state dir and a leftover <state_dir>/timeline.db: the
    configured timeline is archived once as timeline.db, the stray copy left out; what
    create calls ok, verify accepts."""
    import sqlite3
    cfg = base_config(tmp_path / "state", timeline={"path": str(tmp_path / "tl" / "t.db")})
    async with running_gateway(cfg) as gw:
        await gw.local.send("one", to="ann")
        await gw.timeline_hooks.flush()
    state = tmp_path / "state"
    sqlite3.connect(state / "timeline.db").execute("CREATE TABLE stray (x)").connection.close()
    (state / "timeline.db-pending").write_bytes(b"")
    path = write_config(tmp_path, cfg)
    capsys.readouterr()
    assert cli(["--config", str(path), "backup", "create", "--json", "--to",
                str(tmp_path / "b.tgz")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["timeline_sessions"] == 1
    manifest = json.loads(members(tmp_path / "b.tgz")["MANIFEST.json"])
    names = [f["path"] for f in manifest["files"]]
    assert len(names) == len(set(names)) and "timeline.db" in names
    assert verify_archive(tmp_path / "b.tgz").ok


def test_verify_checks_the_gzip_trailer(tmp_path):
    """A cut tail (1-64 bytes) or a changed CRC-32/length in the gzip trailer fails
    verify, though the tar stream inside still reads to its end marker."""
    state = tmp_path / "state"
    (state / "agents").mkdir(parents=True)
    (state / "agents" / "notes.md").write_bytes(os.urandom(3000).hex().encode())
    made = create_backup(state, tmp_path / "b.tgz")
    good = made.path.read_bytes()
    assert verify_archive(made.path).ok
    bad = tmp_path / "bad.tgz"
    for cut in range(1, 65):
        bad.write_bytes(good[:-cut])
        out = verify_archive(bad)
        assert not out.ok and "the archive is damaged" in out.problems[0], cut
    for i in range(1, 9):  # the 8 trailer bytes: CRC-32, then ISIZE
        flipped = bytearray(good)
        flipped[-i] ^= 0x01
        bad.write_bytes(bytes(flipped))
        out = verify_archive(bad)
        assert not out.ok and "the archive is damaged" in out.problems[0], i


LITERAL = ["models:\n  providers:\n    x: {api_key: sk-live-1}\n",
           "channels:\n  list:\n    - api_key: sk-live-1\n      name: a\n",
           'models:\n  "api_key": sk-live-1\n',
           "storage:\n  dsn: postgresql://tg:hunter2@db.local/tg\n",
           "storage:\n  dsn: postgresql://tg@db.local/tg?password=hunter2\n",
           "models:\n  p:\n    headers:\n      x-api-key: abc123\n",
           "models:\n  p:\n    headers:\n      Authorization: Bearer sk-live-1\n",
           "models:\n  p:\n    api_key: ${K:-sk-literal}\n",
           "channels:\n  slack: {bot_token: 'xoxb-1'}\n",
           "broken: [\n  api_key: sk-live-1\n"]  # does not parse: the line fallback
REFERENCES = ["models:\n  p:\n    api_key: ${OPENAI_API_KEY}\n    max_tokens: 4096\n",
              "models:\n  p:\n    headers:\n      Authorization: Bearer ${TOKEN}\n",
              "storage:\n  dsn: postgresql://tg:${PGPASSWORD}@db.local/tg\n",
              "storage:\n  dsn: postgresql://tg@db.local/tg\n",
              "backup:\n  include_secrets: false\n  keep: 3\n",
              "channels:\n  slack: {bot_token: '${SLACK_BOT_TOKEN}', token: ''}\n"]


@pytest.mark.parametrize("text", LITERAL)
def test_a_literal_secret_in_any_yaml_form_is_found(text):
    from gateway.backup.secrets import holds_literal_secret
    assert holds_literal_secret(text)


@pytest.mark.parametrize("text", REFERENCES)
def test_references_are_no_literal_secret(text):
    from gateway.backup.secrets import holds_literal_secret
    assert not holds_literal_secret(text)


def test_a_config_with_a_dsn_password_is_left_out_of_a_backup(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "config.yaml").write_text(LITERAL[3])
    (state / "other.yaml").write_text(REFERENCES[2])
    made = create_backup(state, tmp_path / "b.tgz")
    assert made.secrets_left_out == ["config.yaml"]
    assert set(members(made.path)) == {"MANIFEST.json", "state/other.yaml"}


def test_staging_dirs_of_a_killed_create_are_removed_by_the_next(tmp_path):
    """A create killed with -9 leaves .tidegate-backup-XXXX behind: the next create removes
    it (its lock is free, or it has none and is old), never the dir of a running one."""
    import fcntl
    state = tmp_path / "state"
    state.mkdir()
    (state / "a.txt").write_text("a")
    out = tmp_path / "out"
    killed, old, young, running = (out / f".tidegate-backup-{n}" for n in
                                   ("killed", "old", "young", "running"))
    for d in (killed, old, young, running):
        (d / "state").mkdir(parents=True)
        (d / "archive.partial").write_bytes(b"x" * 100)
    (killed / ".lock").touch()
    os.utime(old, (T0, T0))
    fd = os.open(running / ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a create running in another process
    try:
        made = create_backup(state, out / "b.tgz")
    finally:
        os.close(fd)
    assert sorted(p.name for p in out.iterdir()) == [
        ".tidegate-backup-running", ".tidegate-backup-young", "b.tgz"]
    assert verify_archive(made.path).ok


def test_restored_directories_keep_their_modes(tmp_path):
    state = tmp_path / "state"
    (state / "agents" / "main" / "sessions").mkdir(parents=True)
    (state / "workspace").mkdir()
    for d, mode in (("agents", 0o700), ("agents/main", 0o700),
                    ("agents/main/sessions", 0o750), ("workspace", 0o700)):
        os.chmod(state / d, mode)
    (state / "agents" / "main" / "sessions" / "s.jsonl").write_text('{"a":1}\n')
    (state / "workspace" / "AGENTS.md").write_text("hi")
    made = create_backup(state, tmp_path / "b.tgz")
    assert restore(made.path, tmp_path / "r").ok
    modes = {d: os.stat(tmp_path / "r" / d).st_mode & 0o777 for d in
             ("agents", "agents/main", "agents/main/sessions", "workspace")}
    assert modes == {"agents": 0o700, "agents/main": 0o700, "agents/main/sessions": 0o750,
                     "workspace": 0o700}


def test_a_backup_into_the_state_dir_is_refused_and_old_ones_left_out(tmp_path, capsys):
    state = tmp_path / "state"
    path = write_config(tmp_path, base_config(state))
    (state / "agents").mkdir(parents=True)
    (state / "agents" / "a.txt").write_text("a")
    (state / "tidegate-backup-20260101T000000Z.tar.gz").write_bytes(b"an older backup")
    (state / ".tidegate-backup-x1" / "state").mkdir(parents=True)
    (state / ".tidegate-backup-x1" / "state" / "b.txt").write_text("staged")
    assert cli(["--config", str(path), "backup", "create", "--to",
                str(state / "agents" / "mine.tgz")]) == 1
    err = capsys.readouterr().err
    assert "inside the state dir" in err and not (state / "agents" / "mine.tgz").exists()
    assert cli(["--config", str(path), "backup", "create"]) == 0  # into <state>/backups
    [made] = (state / "backups").iterdir()
    assert set(members(made)) == {"MANIFEST.json", "state/agents/a.txt"}
