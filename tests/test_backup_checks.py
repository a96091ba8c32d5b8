"""What ``backup verify`` proves across files (gateway/backup/consistency.py), and a
destination that refuses writes (a full disk: here a file size limit, RLIMIT_FSIZE, in a
CLI subprocess; through the running gateway: a destination under a regular file) being
reported as a write error naming the destination, exit 1, nothing left behind."""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
from pathlib import Path

import yaml

from gateway.backup.archive import create_backup
from gateway.backup.check import verify_archive
from gateway.cli.main import main as cli
from runtime.context.messages import user_message
from runtime.timeline import Timeline
from runtime.transcript import TranscriptWriter
from tests.helpers import base_config, running_gateway

ROOT = Path(__file__).resolve().parent.parent


async def serve(tmp_path: Path) -> tuple[dict, Path]:
    """A stopped gateway's state dir after three turns in two sessions; its config file."""
    cfg = base_config(tmp_path / "state")
    async with running_gateway(cfg) as gw:
        for text, to in (("one", "ann"), ("two", "bob"), ("three", "ann")):
            await gw.local.send(text, to=to)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return cfg, path


def sessions(state: Path) -> Path:
    return state / "agents/main/sessions"


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_verify_names_a_session_whose_transcript_is_missing(tmp_path):
    await serve(tmp_path)
    state = tmp_path / "state"
    gone = min(sessions(state).glob("*.jsonl"))
    gone.unlink()
    made = create_backup(state, tmp_path / "b.tgz", timeline_db=state / "timeline.db")
    out = verify_archive(made.path)
    assert not out.ok
    assert out.problems[0] == (
        f"agents/main/sessions/sessions.db: session "
        f"{_key_of(state, gone.stem)} ({gone.stem}) has finished turns but its transcript "
        f"agents/main/sessions/{gone.name} is not in the backup")


def _key_of(state: Path, sid: str) -> str:
    import sqlite3
    conn = sqlite3.connect(sessions(state) / "sessions.db")
    try:
        return conn.execute("SELECT session_key FROM sessions WHERE session_id = ?",
                            (sid,)).fetchone()[0]
    finally:
        conn.close()


async def test_verify_names_a_recorded_message_the_transcript_lacks(tmp_path):
    await serve(tmp_path)
    state = tmp_path / "state"
    transcript = min(sessions(state).glob("*.jsonl"))
    sid = transcript.stem
    writer = TranscriptWriter(transcript, session_id=sid, session_key="k").open()
    writer.append_message(user_message("from the platform", 1_767_225_600_000,
                                       messageId="m-1"))
    writer.close()
    tl = await Timeline.open_sqlite(state / "timeline.db")
    try:
        await tl.append_event(sid, "USER_INPUT", {"text": "from the platform",
                                                  "message_id": "m-1"})
        assert verify_archive(create_backup(state, tmp_path / "ok.tgz",
                                            timeline_db=state / "timeline.db").path).ok
        await tl.append_event(sid, "USER_INPUT", {"text": "never written",
                                                  "message_id": "m-404"})
    finally:
        await tl.close()
    out = verify_archive(create_backup(state, tmp_path / "bad.tgz",
                                       timeline_db=state / "timeline.db").path)
    assert not out.ok
    assert out.problems[0].startswith(f"timeline.db: session {sid} records message m-404 ")
    assert out.problems[0].endswith(f"that its transcript agents/main/sessions/{sid}.jsonl "
                                    "does not hold")


def _limit_file_size() -> None:
    # writes beyond 256 KiB fail with EFBIG (Python ignores SIGXFSZ), as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))


async def test_a_destination_that_refuses_writes_is_a_write_error_naming_it(tmp_path):
    _, path = await serve(tmp_path)
    state = tmp_path / "state"
    big = sessions(state) / "00000000-0000-4000-8000-000000000000.jsonl"
    big.write_text('{"type":"session","version":3,"id":"00000000"}\n' + "x" * (1 << 20) + "\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dest = out_dir / "b.tar.gz"
    argv = [sys.executable, "-m", "gateway.cli", "--config", str(path), "backup", "create",
            "--to", str(dest)]
    proc = await asyncio.to_thread(subprocess.run, argv, cwd=ROOT, capture_output=True,
                                   text=True, timeout=60, preexec_fn=_limit_file_size)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.strip().splitlines()[-1]
    assert err.startswith(f"error: backup failed: {dest}: cannot be written: File too large"
                          " (while copying agents/main/sessions/"), err
    assert "cannot be read" not in proc.stderr and "Traceback" not in proc.stderr
    assert leftovers(out_dir) == []  # no archive, no staging dir, no partial file
    last = json.loads((state / "backup-last.json").read_text())
    assert last["ok"] is False and last["error"].startswith(f"{dest}: cannot be written")


async def test_through_the_gateway_a_write_error_names_the_destination(tmp_path, capsys):
    cfg = base_config(tmp_path / "state")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    (tmp_path / "afile").write_text("not a directory")
    dest = tmp_path / "afile" / "b.tar.gz"
    async with running_gateway(cfg) as gw:
        await gw.local.send("one", to="ann")
        code = await asyncio.to_thread(cli, ["--config", str(path), "backup", "create",
                                             "--to", str(dest)])
        ok = await asyncio.to_thread(cli, ["--config", str(path), "backup", "create",
                                           "--to", str(tmp_path / "good.tgz")])
    err = capsys.readouterr().err
    assert code == 1 and ok == 0
    assert f"error: backup failed: {dest}: cannot be written: Not a directory" in err
    assert leftovers(tmp_path) == ["afile", "config.yaml", "good.tgz", "state"]
    assert (tmp_path / "afile").read_text() == "not a directory"
    assert verify_archive(tmp_path / "good.tgz").ok
