"""The file tools cannot be raced out of the workspace: every path is walked from a
directory fd with O_NOFOLLOW (runtime/tools/workspace_fs.py), so a process in the
workspace swapping a component for a symlink never makes a write land outside."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import threading
from pathlib import Path

import pytest

from runtime.tools import workspace_fs as wfs
from runtime.tools.fs import edit_tool, read_tool, write_tool
from runtime.tools.patch import apply_patch_tool
from runtime.tools.registry import ToolContext, ToolError, ToolRefused


def _ctx(ws: Path) -> ToolContext:
    return ToolContext(workspace=ws, session_key="agent:main:main", agent_id="main")


@pytest.fixture()
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    ws, out = tmp_path / "ws", tmp_path / "outside"
    (ws / "a" / "b" / "c").mkdir(parents=True)
    out.mkdir()
    (out / "secret.txt").write_text("outside")
    (ws / "a" / "b" / "c" / "f.txt").write_text("inside")
    return ws, out


_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE): never a moment without."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                       _RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")


def _swapper(ws: Path, out: Path, stop: threading.Event) -> None:
    """Flip ``ws/d`` between a real directory and a symlink to ``out`` until stopped."""
    (ws / "d.other").symlink_to(out)
    while not stop.is_set():
        _exchange(ws / "d", ws / "d.other")


def test_write_raced_by_a_symlink_swap_never_lands_outside(dirs) -> None:
    ws, out = dirs
    (ws / "d").mkdir()
    stop = threading.Event()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the swapper with every step of a write
    swapper = threading.Thread(target=_swapper, args=(ws, out, stop), daemon=True)
    swapper.start()

    async def writes() -> int:
        ok = 0
        for i in range(300):
            try:
                await write_tool({"path": f"d/f{i}.txt", "content": "x"}, _ctx(ws))
                ok += 1
            except (ToolError, OSError):
                pass  # refused (a link out) or the directory was away: both fine
        return ok

    try:
        ok = asyncio.run(writes())
    finally:
        stop.set()
        swapper.join()
        sys.setswitchinterval(old)
    assert sorted(os.listdir(out)) == ["secret.txt"]
    assert ok > 0  # the writes that went through landed inside
    found = [p for p in ws.rglob("f*.txt") if p.parent.name in ("d", "d.other")]
    assert len(found) == ok


@pytest.mark.parametrize("where", ["a", "a/b", "a/b/c", "a/b/c/f.txt"])
def test_a_symlink_out_at_any_position_is_refused(dirs, where: str) -> None:
    ws, out = dirs
    target = ws / where
    if target.is_dir():
        os.rename(target, ws / "moved")
    else:
        target.unlink()
    target.symlink_to(out / "secret.txt" if where.endswith(".txt") else out)
    ctx = _ctx(ws)
    for call in (lambda: read_tool({"path": "a/b/c/f.txt"}, ctx),
                 lambda: write_tool({"path": "a/b/c/f.txt", "content": "pwned"}, ctx),
                 lambda: edit_tool({"path": "a/b/c/f.txt", "old_text": "outside",
                                    "new_text": "pwned"}, ctx)):
        with pytest.raises(ToolRefused, match="is outside the workspace"):
            asyncio.run(call())
    # the fd walk itself (not only the up-front check) refuses it
    with pytest.raises(ToolRefused, match="is outside the workspace"):
        wfs.write_bytes(ws, "a/b/c/f.txt", b"pwned")
    with pytest.raises(ToolRefused, match="is outside the workspace"):
        wfs.read_bytes(ws, "a/b/c/f.txt")
    assert (out / "secret.txt").read_text() == "outside"
    assert sorted(os.listdir(out)) == ["secret.txt"]


def test_symlinks_inside_the_workspace_still_work(dirs) -> None:
    ws, _ = dirs
    (ws / "link").symlink_to("a/b")  # relative, inside
    (ws / "abs").symlink_to(ws / "a" / "b" / "c" / "f.txt")  # absolute, inside
    assert wfs.read_bytes(ws, "link/c/f.txt") == b"inside"
    assert wfs.read_bytes(ws, "abs") == b"inside"
    assert wfs.write_bytes(ws, "link/c/new.txt", b"n") == "a/b/c/new.txt"
    assert (ws / "a" / "b" / "c" / "new.txt").read_bytes() == b"n"
    assert wfs.read_bytes(ws, "a/b/../b/c/f.txt") == b"inside"


def test_absolute_dotdot_and_loops_are_refused(dirs) -> None:
    ws, _ = dirs
    with pytest.raises(ToolRefused, match="is absolute"):
        wfs.read_bytes(ws, "/etc/passwd")
    with pytest.raises(ToolRefused, match="is outside the workspace"):
        wfs.write_bytes(ws, "a/../../x.txt", b"x")
    with pytest.raises(ToolRefused, match="is outside the workspace"):
        (ws / "up").symlink_to("../outside")
        wfs.read_bytes(ws, "up/secret.txt")
    (ws / "loop").symlink_to("loop")
    with pytest.raises(ToolError, match="too many symbolic links"):
        wfs.read_bytes(ws, "loop/x")
    assert not (ws.parent / "x.txt").exists()


def test_write_keeps_mode_replaces_a_final_link_inside_and_patch_uses_the_walk(dirs) -> None:
    ws, out = dirs
    script = ws / "run.sh"
    script.write_text("echo 1\n")
    script.chmod(0o755)
    wfs.write_bytes(ws, "run.sh", b"echo 2\n")
    assert script.stat().st_mode & 0o777 == 0o755
    (ws / "a" / "b" / "c").rename(ws / "c.real")
    (ws / "a" / "b" / "c").symlink_to(out)
    patch = ("--- a/a/b/c/f.txt\n+++ b/a/b/c/f.txt\n@@ -1 +1 @@\n-outside\n+pwned\n")
    with pytest.raises(ToolRefused, match="is outside the workspace"):
        asyncio.run(apply_patch_tool({"patch": patch}, _ctx(ws)))
    assert (out / "secret.txt").read_text() == "outside"


def test_media_to_upload_is_read_through_the_walk_and_staged(dirs) -> None:
    from runtime.media.outbound import MediaHasSecret, stage_media
    from runtime.tools.secrets import NO_SECRETS, SecretScrubber
    ws, out = dirs
    stage = ws.parent / "stage"
    (ws / "a" / "b" / "c").rename(ws / "c.real")
    (ws / "a" / "b" / "c").symlink_to(out)  # a link out in the middle
    with pytest.raises(ToolError, match="outside the workspace"):
        stage_media(ws, "a/b/c/secret.txt", NO_SECRETS, stage)
    (ws / "keys.txt").write_text("token sk-live-abcdef123456\n")
    with pytest.raises(MediaHasSecret, match=r"\[redacted:OPENAI_API_KEY\]") as exc:
        stage_media(ws, "keys.txt", SecretScrubber({"OPENAI_API_KEY": "sk-live-abcdef123456"}),
                    stage)
    assert "sk-live" not in str(exc.value)
    assert not stage.exists() or not list(stage.rglob("keys.txt"))


def test_provenance_survives_a_reload_and_taints_reads_and_attachments(tmp_path) -> None:
    from gateway.inbound.provenance import FileProvenance
    from runtime.tools.message import message_tool
    ws = tmp_path / "ws"
    (ws / "inbox" / "d").mkdir(parents=True)
    (ws / "inbox" / "d" / "x-notes.txt").write_text("hi")
    index = tmp_path / "state" / "media" / "provenance.jsonl"
    FileProvenance(index).record("main", "inbox/d/x-notes.txt", "telegram", "777", "ab")
    prov = FileProvenance(index)  # a restart: read back from the file
    assert prov.sender_of("main", "inbox/d/x-notes.txt") == ("telegram", "777")

    def taint(agent: str, rel: str, sha256: str = "") -> str | None:
        return prov.taint(agent, rel, lambda a, ch, s: "stranger" if s == "777" else None,
                          lambda ch, s: f"{ch}:{s}", sha256=sha256)

    async def send(*_a, **_k) -> str:
        return "sent"

    ctx = _ctx(ws)
    ctx.extra["file_taint"] = taint
    asyncio.run(read_tool({"path": "inbox/./d/x-notes.txt"}, ctx))
    assert ctx.taint == ["file from telegram:777: inbox/d/x-notes.txt"]
    ctx2 = _ctx(ws)
    ctx2.extra["file_taint"], ctx2.send_message = taint, send
    asyncio.run(message_tool({"media": ["inbox/d/x-notes.txt"]}, ctx2))
    assert ctx2.taint == ["file from telegram:777: inbox/d/x-notes.txt"]
    ctx3 = _ctx(ws)
    ctx3.extra["file_taint"] = taint
    (ws / "mine.txt").write_text("mine")
    asyncio.run(read_tool({"path": "mine.txt"}, ctx3))
    assert ctx3.taint == []
