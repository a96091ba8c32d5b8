"""Background ``exec`` runs and the ``process`` tool that lists, polls, reads and kills
them (seed 001 §3 source 4, "exec + process management").

``{action: list|poll|log|kill, job_id?, tail?}``. An agent sees only its own jobs. Jobs
stay listed for :data:`KEEP_FINISHED` after they end (at most :data:`MAX_JOBS` kept), so
a model can still read the output of a command that finished between two turns.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

import structlog

from runtime.tools.file_taint import note_output_taint
from runtime.tools.registry import Tool, ToolContext, ToolError, object_schema, optional_int

log = structlog.get_logger(__name__)

KEEP_FINISHED = 3600.0  # seconds
MAX_JOBS = 64


def kill_group(pid: int) -> None:
    """SIGKILL the process group of ``pid`` (exec starts every command in its own)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass(slots=True)
class BackgroundJob:
    """One background command. ``status``: running | exited | timeout | failed | killed;
    times are epoch seconds; ``output`` has ``text()`` (head and tail of the output);
    ``taint``: the (live) taint list of the turn that started it: reading its output
    taints the reading turn alike (docs/exec.md "Tainted turns")."""

    job_id: str
    command: str
    agent_id: str
    session_key: str
    started_at: float
    proc: Any
    output: Any
    status: str = "running"
    ended_at: float | None = None
    killed: bool = False
    taint: list[str] = field(default_factory=list)

    def finish(self, now: float, status: str) -> None:
        if self.status == "running":
            self.status = "killed" if self.killed else status
            self.ended_at = now

    def describe(self, now: float) -> str:
        end = self.ended_at if self.ended_at is not None else now
        code = "" if self.proc.returncode is None else f", exit code {self.proc.returncode}"
        return (f"{self.job_id} [{self.status}{code}] {end - self.started_at:.0f}s "
                f"`{self.command[:120]}`")


class JobTable:
    """The gateway's background jobs by id (process-wide)."""

    def __init__(self) -> None:
        self._jobs: dict[str, BackgroundJob] = {}

    def add(self, job: BackgroundJob) -> BackgroundJob:
        self._prune(job.started_at)
        self._jobs[job.job_id] = job
        return job

    def running(self) -> int:
        return sum(1 for j in self._jobs.values() if j.status == "running")

    def of_agent(self, agent_id: str) -> list[BackgroundJob]:
        return [j for j in self._jobs.values() if j.agent_id == agent_id]

    def get(self, agent_id: str, job_id: str) -> BackgroundJob:
        job = self._jobs.get(job_id)
        if job is None or job.agent_id != agent_id:
            raise ToolError(f"no background job {job_id!r} (use action 'list')")
        return job

    def _prune(self, now: float) -> None:
        done = [j for j in self._jobs.values() if j.ended_at is not None and
                (now - j.ended_at > KEEP_FINISHED or len(self._jobs) >= MAX_JOBS)]
        for j in done:
            self._jobs.pop(j.job_id, None)


JOBS = JobTable()


def _kill(job: BackgroundJob, ctx: ToolContext) -> str:
    if job.status != "running":
        return f"job {job.job_id} is not running ({job.status})"
    job.killed = True
    kill_group(job.proc.pid)
    log.info("exec_background_killed", job_id=job.job_id, session_key=ctx.session_key)
    return f"killed job {job.job_id}"


async def process_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    """Handler of ``process`` (module docstring). Raises ToolError."""
    action = args.get("action")
    now = ctx.clock.time()
    if action == "list":
        jobs = JOBS.of_agent(ctx.agent_id)
        return "\n".join(j.describe(now) for j in jobs) or "no background jobs"
    job_id = args.get("job_id")
    if not isinstance(job_id, str) or not job_id:
        raise ToolError("argument 'job_id' is required for poll, log and kill")
    job = JOBS.get(ctx.agent_id, job_id)
    if action == "poll":
        return job.describe(now)
    if action == "log":
        text = job.output.text()
        tail = optional_int(args, "tail", 0, hi=len(text))
        shown = text[-tail:] if tail else text
        for why in job.taint:  # the starting turn's untrusted input, arriving here
            reason = f"output of background command {job.job_id}, started in a turn " \
                     f"tainted by {why}"
            if reason not in ctx.taint:
                ctx.taint.append(reason)
        await note_output_taint(ctx, job.command, shown)
        return shown or "(no output yet)"
    if action == "kill":
        return _kill(job, ctx)
    raise ToolError(f"unknown action {action!r}: use list, poll, log or kill")


PROCESS_TOOL = Tool(
    "process",
    "Manage background exec commands: 'list' your jobs, 'poll' one (status, exit code), "
    "'log' its output (optional tail in characters), 'kill' it.",
    object_schema({"action": {"type": "string", "enum": ["list", "poll", "log", "kill"]},
                   "job_id": {"type": "string"}, "tail": {"type": "integer"}},
                  ["action"]),
    process_tool, source="runtime", group="group:runtime", side_effects=True,
)
