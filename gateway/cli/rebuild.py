"""``tidegate timeline rebuild-transcript SESSION [--out PATH]`` (issue 5 "Recovery"): a
lost transcript rebuilt from the timeline alone, written through the real
:class:`runtime.transcript.TranscriptWriter` and never over an existing transcript.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from gateway.config.load import LoadedConfig
from gateway.routing import agent_of_key
from gateway.sessions.logs import transcript_path
from runtime.timeline import Timeline, TimelineInfo
from runtime.timeline.export import rebuild_transcript_messages
from runtime.transcript import TranscriptWriter


class _StoppedClock:
    """A clock that always reads ``epoch`` (seconds): the rebuilt header's timestamp."""

    def __init__(self, epoch: float) -> None:
        self.epoch = epoch

    def time(self) -> float:
        return self.epoch


def gateway_running(state_dir: Path) -> bool:
    """True while a gateway holds ``<state_dir>/gateway.lock`` (gateway.service.daemon)."""
    import fcntl
    try:
        fd = os.open(state_dir / "gateway.lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


async def rebuild(tl: Timeline, info: TimelineInfo, loaded: LoadedConfig,
                  out: Path | None) -> int:
    """Write the transcript rebuilt from the timeline, never over an existing one: to
    ``out``, else where the configured storage keeps transcripts (the file, or the
    ``transcript_lines`` rows of that session on PostgreSQL)."""
    events = await tl.get_timeline(info.session_id)
    messages = rebuild_transcript_messages(events)
    try:
        agent = agent_of_key(info.session_key)
    except ValueError:
        agent = loaded.config.default_agent()
    try:
        cwd: str | None = str(loaded.config.workspace_for(agent))
    except KeyError:  # an agent no longer configured: its transcripts still live here
        cwd = None
    if out is None and loaded.config.storage.backend == "postgres":
        return _rebuild_into_postgres(loaded, agent, info, messages, cwd, len(events))
    target = out or transcript_path(loaded.state_dir, agent, info.session_id)
    if out is None and gateway_running(loaded.state_dir):
        # The daemon may hold the session's (deleted) transcript open and keep writing to it.
        print("error: the gateway is running on this state dir; stop it before rebuilding "
              "a transcript in place (or pass --out PATH)", file=sys.stderr)
        return 1
    if target.exists():
        hint = "" if out else "; pass --out PATH to write the rebuilt transcript elsewhere"
        print(f"error: {target} exists and was not touched{hint}", file=sys.stderr)
        return 1
    try:
        _write_new_transcript(target, info, messages, cwd)
    except FileExistsError:
        print(f"error: {target} appeared meanwhile and was not touched", file=sys.stderr)
        return 1
    print(f"rebuilt {len(messages)} messages from {len(events)} timeline events of "
          f"{info.session_id} ({info.session_key}) into {target}")
    return 0


def _write_new_transcript(target: Path, info: TimelineInfo, messages: list[dict[str, Any]],
                          cwd: str | None) -> None:
    """Header + message entries via the real TranscriptWriter into a temp file, fsync, then
    hard-link it into place: atomic, and FileExistsError instead of replacing a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.rebuild-{os.getpid()}.tmp")
    # The header carries the session's start, not the time of the rebuild.
    writer = TranscriptWriter(tmp, session_id=info.session_id, session_key=info.session_key,
                              clock=_StoppedClock(info.created_at / 1000), cwd=cwd)
    try:
        writer.open()
        for msg in messages:
            writer.append_message(msg)
        writer.close()
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.link(tmp, target)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)


def _rebuild_into_postgres(loaded: LoadedConfig, agent: str, info: TimelineInfo,
                           messages: list[dict[str, Any]], cwd: str | None,
                           events: int) -> int:
    """The same lines the file would hold, inserted as the session's rows in one
    transaction; refused when the session has any row (PostgreSQL keeps transcripts
    append-only, so there is nothing to overwrite; the table refuses that anyway)."""
    import tempfile

    from gateway.service.storage import offline_transcripts
    from runtime.storage.postgres.errors import StorageUnavailable
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rebuilt.jsonl"
        _write_new_transcript(path, info, messages, cwd)
        lines = path.read_text("utf-8").splitlines()
    try:
        store, close = offline_transcripts(loaded)
    except StorageUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    where = store.location(agent, info.session_id)
    try:
        store.write_new(agent, info.session_id, lines)
    except FileExistsError:
        print(f"error: {where} has lines and was not touched; pass --out PATH to write "
              "the rebuilt transcript to a file", file=sys.stderr)
        return 1
    finally:
        close()
    print(f"rebuilt {len(messages)} messages from {events} timeline events of "
          f"{info.session_id} ({info.session_key}) into {where}")
    return 0
