"""The ``exec`` tool: run a shell command in the workspace (seed 001 §tools).

``{command, timeout?, background?}``. Foreground commands run under a timeout (seconds;
default ``agents.*.exec.timeout``) and their combined stdout/stderr is capped (head and
tail kept). The whole process group is killed on timeout. ``background: true`` returns at
once; on completion the exit code and the tail of the output are reported through
``ToolContext.on_background_done`` (the gateway enqueues it as a system event that wakes
the heartbeat), with the taint of the turn that started it: the output is that turn's
untrusted input arriving late, so the turn the event wakes is tainted alike. A command
that names or prints a file a non-owner sent taints its turn
(runtime/tools/file_taint.py). The child gets an allowlisted environment
(:func:`child_env`): never a secret. Every command's process group is handed to the
exec reaper (runtime/tools/exec_reaper.py), which kills it when the gateway dies,
``kill -9`` included; a command waits at a gate on its stdin until its group is tracked,
so no instant of a kill leaves one running.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from collections.abc import Mapping
from typing import Any

import structlog

from runtime.approvals.match import DEFAULT_PATH, exec_path
from runtime.sandbox.wrap import clean_up
from runtime.tools.exec_reaper import REAPER
from runtime.tools.file_taint import note_output_taint, output_taint
from runtime.tools.process import JOBS, BackgroundJob, kill_group
from runtime.tools.registry import ToolContext, ToolError, require_str

log = structlog.get_logger(__name__)

_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE_KEY|CREDENTIAL)",
                          re.IGNORECASE)
_background: set[asyncio.Task] = set()


PASSED_THROUGH = ("PATH", "LANG", "TZ")
"""The gateway's variables a command inherits (when set); everything else is dropped."""


def child_env(workspace: str, extra: Mapping[str, str] | None = None,
              secret_names: frozenset[str] = frozenset()) -> dict[str, str]:
    """The environment of a command: ``PATH``, ``LANG`` and ``TZ`` from ours, ``HOME`` =
    the workspace, plus ``extra`` (``tools.exec.env``). A name in ``secret_names`` (the
    variables the config references as secrets) or that looks like a secret is never
    passed, ``extra`` included (the config load refuses such entries already). ``PATH``
    loses its empty and relative entries and those inside the workspace
    (runtime/approvals/match.py ``exec_path``: the allowlist resolves with the same
    value)."""
    env = {k: os.environ[k] for k in PASSED_THROUGH if k in os.environ}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(extra or {})
    env["PATH"] = exec_path(env["PATH"], workspace)
    env["HOME"] = workspace
    return {k: v for k, v in env.items()
            if k not in secret_names and not _SECRET_NAME.search(k)}


class _Capped:
    """Keeps the first and last ``limit/2`` characters of a stream."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        half = self.limit // 2
        if len(self.head) < half:
            take = half - len(self.head)
            self.head += data[:take]
            data = data[take:]
        if data:
            self.tail += data
            if len(self.tail) > half:
                del self.tail[: len(self.tail) - half]

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        if self.total <= len(self.head) + len(self.tail):
            return head + self.tail.decode("utf-8", errors="replace")
        skipped = self.total - len(self.head) - len(self.tail)
        return (head + f"\n[... {skipped} bytes omitted ...]\n"
                + self.tail.decode("utf-8", errors="replace"))


# The command waits behind this gate until the reaper knows its group: a gateway killed
# between spawn and track() would otherwise leave it running. EOF (the gateway died
# first) means the command never starts.
_GATE = "read _ || exit 125\nexec </dev/null\n"


async def spawn_gated(command: str, cwd: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    """Start ``sh -c command`` as the leader of its own session, held at the gate (see
    :data:`_GATE`): it runs once :func:`open_gate` is called, never if its stdin closes
    first. stdout and stderr are one pipe; stdin is /dev/null past the gate."""
    return await asyncio.create_subprocess_shell(
        _GATE + command, cwd=cwd, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=env, start_new_session=True)


async def open_gate(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(b"\n")
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # already gone (killed): its exit code tells
    proc.stdin.close()


async def _spawn(command: str, ctx: ToolContext) -> asyncio.subprocess.Process:
    """Start ``command`` (in the turn's sandbox when it has one: runtime/sandbox/);
    ``proc.leftovers`` is what its sandbox leaves (its pids cgroup, its container; None
    without a sandbox), removed by :func:`_pump` however the command ends."""
    env = child_env(str(ctx.workspace), ctx.extra.get("exec_env"), ctx.secret_env)
    sandbox, leftovers = ctx.extra.get("sandbox"), None
    if sandbox is not None:
        command, leftovers = sandbox.prepare(command, ctx.workspace, env)
    proc = await spawn_gated(command, str(ctx.workspace), env)
    proc.leftovers = leftovers  # type: ignore[attr-defined]
    REAPER.track(proc.pid)  # its own session: the group id is its pid
    await open_gate(proc)
    return proc


async def _pump(proc: asyncio.subprocess.Process, out: _Capped, ctx: ToolContext,
                timeout: float) -> bool:
    """Read the output until the process exits; kill its group on timeout or
    cancellation. Returns whether it timed out."""

    async def pump() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            out.feed(chunk)
        await proc.wait()

    timed_out = False
    try:
        async with ctx.clock.timeout(timeout):
            await pump()
    except TimeoutError:
        timed_out = True
    finally:
        if proc.returncode is None:
            kill_group(proc.pid)
            await proc.wait()
        await clean_up(getattr(proc, "leftovers", None))
    return timed_out


async def _run(command: str, ctx: ToolContext, timeout: float) -> tuple[int | None, str, bool]:
    proc = await _spawn(command, ctx)
    out = _Capped(ctx.exec_max_output)
    timed_out = await _pump(proc, out, ctx, timeout)
    return proc.returncode, out.text(), timed_out


def _format(code: int | None, output: str, timed_out: bool, timeout: float) -> str:
    status = f"timed out after {timeout:g}s (killed)" if timed_out else f"exit code {code}"
    return f"[{status}]\n{output}" if output else f"[{status}] (no output)"


async def _carried_taint(job: BackgroundJob, ctx: ToolContext, text: str
                         ) -> tuple[str, ...]:
    """Why the report ``text`` of background command ``job`` taints the turn it reaches:
    what tainted the turn that started it (read at completion: what tainted it after
    the start counts too), and a file from a non-owner in its output
    (runtime/tools/file_taint.py)."""
    found = [f"output of background command {job.job_id}, started in a turn tainted by "
             f"{why}" for why in dict.fromkeys(job.taint)]
    if why := await output_taint(ctx, job.command, text):
        found.append(f"output of background command {job.job_id}: {why}")
    return tuple(found)


async def exec_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    command = require_str(args, "command")
    timeout = args.get("timeout")
    try:
        timeout = float(timeout) if timeout is not None else ctx.exec_timeout
    except (TypeError, ValueError):
        raise ToolError("timeout must be a number of seconds") from None
    timeout = max(0.1, min(timeout, ctx.exec_timeout * 10))
    if not args.get("background"):
        code, output, timed_out = await _run(command, ctx, timeout)
        await note_output_taint(ctx, command, output)  # a file a stranger sent, printed
        return _format(code, output, timed_out, timeout)
    if JOBS.running() >= int(ctx.extra.get("background_max", 8)):
        raise ToolError("too many background commands are running; wait for one to finish")
    proc = await _spawn(command, ctx)
    job = JOBS.add(BackgroundJob(
        job_id=secrets.token_hex(3), command=command, agent_id=ctx.agent_id,
        session_key=ctx.session_key, started_at=ctx.clock.time(), proc=proc,
        output=_Capped(ctx.exec_max_output), taint=ctx.taint))

    async def background() -> None:
        try:
            timed_out = await _pump(proc, job.output, ctx, timeout)
            job.finish(ctx.clock.time(), "timeout" if timed_out else "exited")
            text = (f"Background command {job.job_id} `{command[:200]}` finished: "
                    f"{_format(proc.returncode, job.output.text()[-1500:], timed_out, timeout)}")
        except Exception as exc:  # noqa: BLE001 - reported to the agent, not raised
            job.finish(ctx.clock.time(), "failed")
            text = f"Background command {job.job_id} `{command[:200]}` failed to run: {exc}"
        log.info("exec_background_done", job_id=job.job_id, session_key=ctx.session_key,
                 status=job.status)
        if ctx.on_background_done is not None and not job.killed:
            ctx.on_background_done(ctx.session_key, text, await _carried_taint(job, ctx, text))

    task = asyncio.get_running_loop().create_task(background())
    _background.add(task)
    task.add_done_callback(_background.discard)
    return (f"started background command {job.job_id}; you will get a system event with its "
            f"exit code and output when it finishes (or use the process tool)")
