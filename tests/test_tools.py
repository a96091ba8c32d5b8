"""Core tools: workspace confinement, edits, exec timeouts/caps/background, policy."""

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.tools.exec import child_env
from runtime.tools.fs import resolve_in_workspace
from runtime.tools.policy import Layer, ToolScope, resolve
from runtime.tools.registry import ToolContext, ToolError, ToolRegistry
from runtime.tools.sources import EXEC_TOOL, FS_TOOLS

READ, WRITE, EDIT = FS_TOOLS


@pytest.fixture
def ctx(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    return ToolContext(workspace=ws, session_key="agent:main:main", agent_id="main",
                       exec_timeout=5.0, exec_max_output=400)


@pytest.mark.parametrize("bad", ["../outside.txt", "/etc/passwd", "a/../../x", "~/x",
                                 "sub/../../ws2/x", ""])
async def test_path_escapes_are_refused(ctx, bad, tmp_path):
    with pytest.raises(ToolError):
        await WRITE.handler({"path": bad, "content": "pwned"}, ctx)
    assert not (tmp_path / "outside.txt").exists()


async def test_symlink_leaving_the_workspace_is_refused(ctx, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    os.symlink(secret, ctx.workspace / "link.txt")
    os.symlink(tmp_path, ctx.workspace / "dirlink")
    with pytest.raises(ToolError, match="outside"):
        await READ.handler({"path": "link.txt"}, ctx)
    with pytest.raises(ToolError, match="outside"):
        await WRITE.handler({"path": "dirlink/new.txt", "content": "x"}, ctx)
    assert not (tmp_path / "new.txt").exists()


async def test_write_read_edit_round_trip(ctx):
    assert "wrote" in await WRITE.handler({"path": "notes/a.md", "content": "hello world\n"}, ctx)
    assert (ctx.workspace / "notes/a.md").read_text() == "hello world\n"
    assert await READ.handler({"path": "notes/a.md"}, ctx) == "hello world\n"
    await EDIT.handler({"path": "notes/a.md", "old_text": "world", "new_text": "there"}, ctx)
    assert (ctx.workspace / "notes/a.md").read_text() == "hello there\n"
    with pytest.raises(ToolError, match="not found"):
        await EDIT.handler({"path": "notes/a.md", "old_text": "nope", "new_text": ""}, ctx)
    assert "a.md" in await READ.handler({"path": "notes"}, ctx)
    assert resolve_in_workspace(ctx.workspace, "notes/a.md").is_file()


async def test_exec_runs_in_workspace_with_exit_code(ctx):
    out = await EXEC_TOOL.handler({"command": "pwd; echo err >&2; exit 3"}, ctx)
    assert out.startswith("[exit code 3]")
    assert str(ctx.workspace.resolve()) in out and "err" in out


async def test_exec_timeout_kills_the_process_group(ctx):
    out = await EXEC_TOOL.handler({"command": "sleep 30 & sleep 30; echo never",
                                   "timeout": 0.3}, ctx)
    assert "timed out after 0.3s" in out and "never" not in out


async def test_exec_output_is_capped_head_and_tail(ctx):
    out = await EXEC_TOOL.handler({"command": "seq 1 100000"}, ctx)
    assert len(out) < 600
    assert "\n1\n" in out and out.rstrip().endswith("100000") and "omitted" in out


async def test_exec_background_reports_completion(ctx):
    done = asyncio.Event()
    seen = []

    def on_done(key, text, taint=()):
        seen.append((key, text))
        done.set()

    ctx.on_background_done = on_done
    out = await EXEC_TOOL.handler({"command": "echo finished-ok", "background": True}, ctx)
    assert "started background command" in out
    await asyncio.wait_for(done.wait(), 5)
    key, text = seen[0]
    assert key == "agent:main:main" and "exit code 0" in text and "finished-ok" in text


def test_exec_gated_command_never_runs_when_its_gateway_dies_before_tracking(tmp_path):
    """A gateway killed (SIGKILL) after spawning a command but before handing its group
    to the reaper must not leave the command running: it waits at the gate, sees EOF,
    and exits without running (runtime/tools/exec.py ``spawn_gated``)."""
    probe = (
        "import asyncio, os, signal, sys\n"
        "from runtime.tools.exec import spawn_gated\n"
        "async def main():\n"
        "    proc = await spawn_gated('echo ran > ran.txt; sleep 300', sys.argv[1], dict(os.environ))\n"
        "    print(proc.pid, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], cwd=root,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == -9
    shell = int(r.stdout.split()[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _running(shell):
        time.sleep(0.05)
    assert not _running(shell), "the gated shell outlived its parent"
    assert not (tmp_path / "ran.txt").exists(), "the command ran although nobody tracked it"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_exec_environment_has_no_secrets(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-123")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:abc")
    monkeypatch.setenv("MY_CUSTOM", "visible")
    env = child_env("/ws", {"EXTRA": "x", "MY_CUSTOM2": "y"}, frozenset({"MY_CUSTOM2"}))
    assert "OPENAI_API_KEY" not in env and "TELEGRAM_BOT_TOKEN" not in env
    assert "MY_CUSTOM" not in env  # only the allowlist passes
    assert env["HOME"] == "/ws" and env["EXTRA"] == "x" and "MY_CUSTOM2" not in env


def test_tool_policy_layer_allow_deny_groups_negation():
    reg = ToolRegistry([*FS_TOOLS, EXEC_TOOL])
    scope = ToolScope("main")

    def names(allow, deny=()):
        res = resolve(reg.assembled(), [Layer.of(3, "global", "tools", allow, deny)], scope)
        return sorted(res.tools)

    assert names(None) == ["edit", "exec", "read", "write"]
    assert names(None, ["exec"]) == ["edit", "read", "write"]
    assert names(["group:fs"], ["write"]) == ["edit", "read"]
    assert names(["re*"]) == ["read"]
    assert names(["*", "!exec", "!wr*"]) == ["edit", "read"]
    assert names(["!exec"]) == ["edit", "read", "write"]  # only negations: all but those


async def test_write_refuses_directories_and_leaves_nothing_outside(ctx, tmp_path):
    for target in (".", "sub/..", ""):
        with pytest.raises(ToolError):
            await WRITE.handler({"path": target, "content": "x"}, ctx)
    (ctx.workspace / "d").mkdir()
    with pytest.raises(ToolError, match="directory"):
        await WRITE.handler({"path": "d", "content": "x"}, ctx)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"]


async def test_edit_keeps_file_permissions(ctx):
    script = ctx.workspace / "run.sh"
    script.write_text("echo old\n")
    script.chmod(0o755)
    await EDIT.handler({"path": "run.sh", "old_text": "old", "new_text": "new"}, ctx)
    assert script.read_text() == "echo new\n" and (script.stat().st_mode & 0o777) == 0o755


async def test_files_made_by_write_are_private(ctx):
    """Issue 14 point 6: the state dir is 0700/0600, so a note the agent writes is too."""
    await WRITE.handler({"path": "notes/private.md", "content": "diary"}, ctx)
    assert (ctx.workspace / "notes/private.md").stat().st_mode & 0o777 == 0o600
