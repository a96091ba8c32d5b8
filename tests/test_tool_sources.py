"""The new tool sources: apply_patch (workspace-confined, all-or-nothing), process (list,
poll, log, kill background exec runs), memory_get / memory_write."""

from __future__ import annotations

import asyncio

import pytest

from runtime.clock import FakeClock
from runtime.tools.process import PROCESS_TOOL
from runtime.tools.registry import ToolContext, ToolError
from runtime.tools.sources import (
    APPLY_PATCH_TOOL,
    EXEC_TOOL,
    MEMORY_GET_TOOL,
    MEMORY_TOOL,
    MEMORY_WRITE_TOOL,
    builtin_tools,
)


@pytest.fixture
def ctx(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    return ToolContext(workspace=ws, session_key="agent:main:main", agent_id="main",
                       exec_timeout=5.0, exec_max_output=4000)


PATCH = """--- a/notes.txt
+++ b/notes.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
--- /dev/null
+++ b/new/file.md
@@ -0,0 +1,2 @@
+# New
+hello
"""


async def test_apply_patch_edits_and_creates(ctx):
    (ctx.workspace / "notes.txt").write_text("one\ntwo\nthree\n")
    out = await APPLY_PATCH_TOOL.handler({"patch": PATCH}, ctx)
    assert out == "patched notes.txt; patched new/file.md"
    assert (ctx.workspace / "notes.txt").read_text() == "one\nTWO\nthree\n"
    assert (ctx.workspace / "new/file.md").read_text() == "# New\nhello\n"


async def test_apply_patch_hunk_that_moved_still_applies_and_delete_works(ctx):
    (ctx.workspace / "notes.txt").write_text("zero\nextra\none\ntwo\nthree\n")
    (ctx.workspace / "old.txt").write_text("bye\n")
    patch = PATCH.split("--- /dev/null")[0] + "--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n"
    await APPLY_PATCH_TOOL.handler({"patch": patch}, ctx)
    assert (ctx.workspace / "notes.txt").read_text() == "zero\nextra\none\nTWO\nthree\n"
    assert not (ctx.workspace / "old.txt").exists()


async def test_apply_patch_is_all_or_nothing(ctx):
    (ctx.workspace / "notes.txt").write_text("one\ntwo\nthree\n")
    (ctx.workspace / "other.txt").write_text("a\n")
    bad = ("--- a/other.txt\n+++ b/other.txt\n@@ -1 +1 @@\n-a\n+b\n"
           "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,1 +1,1 @@\n-missing\n+x\n")
    with pytest.raises(ToolError, match="hunk 1 .* does not match"):
        await APPLY_PATCH_TOOL.handler({"patch": bad}, ctx)
    assert (ctx.workspace / "other.txt").read_text() == "a\n"  # first file not written


@pytest.mark.parametrize("target", ["../escape.txt", "/etc/passwd"])
async def test_apply_patch_stays_in_the_workspace(ctx, tmp_path, target):
    patch = f"--- /dev/null\n+++ {target}\n@@ -0,0 +1 @@\n+pwned\n"
    with pytest.raises(ToolError):
        await APPLY_PATCH_TOOL.handler({"patch": patch}, ctx)
    assert not (tmp_path / "escape.txt").exists()


async def test_apply_patch_rejects_garbage(ctx):
    with pytest.raises(ToolError, match="no file changes|not a valid"):
        await APPLY_PATCH_TOOL.handler({"patch": "just some text"}, ctx)


async def test_process_lists_polls_logs_and_kills_background_runs(ctx):
    done = []
    ctx.on_background_done = lambda key, text, taint=(): done.append(text)
    out = await EXEC_TOOL.handler({"command": "echo started; sleep 30", "background": True},
                                  ctx)
    job_id = out.split()[3].rstrip(";")
    assert job_id in await PROCESS_TOOL.handler({"action": "list"}, ctx)
    for _ in range(200):
        if "started" in await PROCESS_TOOL.handler({"action": "log", "job_id": job_id}, ctx):
            break
        await asyncio.sleep(0.01)
    assert "[running]" in await PROCESS_TOOL.handler({"action": "poll", "job_id": job_id}, ctx)
    other = ToolContext(workspace=ctx.workspace, session_key="agent:x:main", agent_id="x")
    with pytest.raises(ToolError, match="no background job"):
        await PROCESS_TOOL.handler({"action": "kill", "job_id": job_id}, other)
    assert await PROCESS_TOOL.handler({"action": "kill", "job_id": job_id}, ctx) == \
        f"killed job {job_id}"
    for _ in range(300):
        if "[killed" in await PROCESS_TOOL.handler({"action": "poll", "job_id": job_id}, ctx):
            break
        await asyncio.sleep(0.01)
    assert "[killed" in await PROCESS_TOOL.handler({"action": "poll", "job_id": job_id}, ctx)
    assert done == []  # a killed job is not reported as finished


async def test_memory_write_then_search_and_get(ctx):
    from runtime.clock import parse_iso
    ctx.clock = FakeClock(parse_iso("2026-03-04T10:00:00Z"))
    ctx.extra["user_timezone"] = "Europe/Berlin"
    assert await MEMORY_WRITE_TOOL.handler(
        {"text": "Anna prefers tea over coffee."}, ctx) == "saved to memory/2026-03-04.md"
    await MEMORY_WRITE_TOOL.handler({"text": "Mia starts school in September.",
                                     "target": "long_term"}, ctx)
    await MEMORY_WRITE_TOOL.handler({"text": "Bought oat milk."}, ctx)
    daily = (ctx.workspace / "memory/2026-03-04.md").read_text()
    assert daily == ("Anna prefers tea over coffee.\n<!-- ts: 2026-03-04T11:00:00+01:00 -->\n"
                     "\nBought oat milk.\n<!-- ts: 2026-03-04T11:00:00+01:00 -->\n")
    hits = await MEMORY_TOOL.handler({"query": "tea"}, ctx)
    assert "Anna prefers tea" in hits
    got = await MEMORY_GET_TOOL.handler({"path": "memory/2026-03-04.md", "from_line": 3,
                                         "lines": 2}, ctx)
    assert got == "3: \n4: Bought oat milk."
    with pytest.raises(ToolError, match="MEMORY.md or memory"):
        await MEMORY_GET_TOOL.handler({"path": "AGENTS.md"}, ctx)


def test_every_builtin_handler_is_a_coroutine_function_of_its_module():
    """The declarations name their handlers by module and function (imported by the first
    call): each name resolves, and to the coroutine function its module defines."""
    import importlib
    import inspect

    targets = {t.name: getattr(t.handler, "target", None) for t in builtin_tools()}
    assert targets.pop("process") is None  # declared with its module, loaded at start anyway
    assert targets["exec"] == "runtime.tools.exec:exec_tool"
    assert targets["memory_search"] == "runtime.tools.memory_tool:memory_search"
    for name, target in targets.items():
        module, _, function = target.partition(":")
        assert inspect.iscoroutinefunction(getattr(importlib.import_module(module),
                                                   function)), name


def test_a_deferred_handler_imports_its_module_on_the_first_call(tmp_path):
    """A tool's module is not imported by the registry; the first call imports it and runs
    the real handler (and a later call the same)."""
    import subprocess
    import sys
    script = ("import asyncio, pathlib, sys\n"
              "from runtime.tools.registry import ToolContext\n"
              "from runtime.tools.sources import builtin_registry\n"
              "reg = builtin_registry()\n"
              "before = 'runtime.tools.fs' in sys.modules\n"
              "ws = pathlib.Path(sys.argv[1])\n"
              "(ws / 'a.txt').write_text('hello')\n"
              "ctx = ToolContext(workspace=ws, session_key='agent:main:main', agent_id='main')\n"
              "read = reg.get('read')\n"
              "out = [asyncio.run(read.handler({'path': 'a.txt'}, ctx)) for _ in range(2)]\n"
              "print(before, 'runtime.tools.fs' in sys.modules, out)\n")
    from tests.helpers import ROOT
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False True ['hello', 'hello']"
