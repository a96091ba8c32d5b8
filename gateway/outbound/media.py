"""Files out, gateway side: resolve what a reply's ``MEDIA:`` lines or the ``message``
tool's ``media`` name (workspace-confined paths) and check them against the platform's
size limit before anything is sent (issue 12 "Files out")."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from channels.media.outbound import upload_problem
from channels.media.store import store_inbox
from runtime.media.outbound import MediaHasSecret, split_media_lines, stage_media
from runtime.tools.registry import ToolError
from runtime.tools.secrets import SecretScrubber

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class OutboundFiles:
    """What checking files to upload needs: the configured secrets (a file holding one is
    never sent) and where the checked copies are kept (``<state_dir>/media-out``)."""

    secrets: SecretScrubber
    stage_dir: Path | None = None


def outbound_files(gw: Any) -> OutboundFiles:
    """The gateway's :class:`OutboundFiles` (the running config's secrets)."""
    from gateway.config.secrets import runtime_secrets, secret_scrubber
    return OutboundFiles(secret_scrubber(gw.loaded, runtime_secrets(gw)),
                         Path(gw.state_dir) / "media-out")


def attachments_for(workspace: Path, channel: str, items: list[str],
                    files: OutboundFiles) -> tuple[list[str], list[str]]:
    """(absolute paths of private copies that can be sent on ``channel``, problems for the
    rest). A file whose bytes hold a configured secret value (``files.secrets``) is never sent:
    the problem names the secret by its ``[redacted:NAME]`` label, logged as
    ``media_out_refused`` with ``reason=secret``."""
    paths: list[str] = []
    problems: list[str] = []
    for item in items:
        try:
            path, _ = stage_media(workspace, item, files.secrets, files.stage_dir)
        except MediaHasSecret as exc:
            log.warning("media_out_refused", channel=channel, reason="secret",
                        path=exc.item, names=exc.names)
            problems.append(str(exc))
            continue
        except ToolError as exc:
            problems.append(str(exc))
            continue
        problem = upload_problem(channel, path)
        if problem:
            problems.append(problem)
        else:
            paths.append(str(path))
    if problems:
        log.warning("media_out_refused", channel=channel, problems=problems)
    return paths, problems


def reply_with_media(workspace: Path, channel: str, text: str, files: OutboundFiles
                     ) -> tuple[str, list[str]]:
    """A final reply's text without its ``MEDIA:`` lines, and the files they name; a file
    that cannot go out (one holding a secret too) is mentioned in the text instead of
    silently missing."""
    text, items = split_media_lines(text)
    if not items:
        return text, []
    paths, problems = attachments_for(workspace, channel, items, files)
    notes = [f"(attachment not sent: {p})" for p in problems]
    return "\n".join([t for t in (text, *notes) if t]), paths


async def tool_media(gw, channel: str, items: list[str], session_key: str | None
                     ) -> list[str]:
    """The ``message`` tool's ``media``: https URLs fetched (SSRF-guarded) into the
    workspace ``downloads/``, every file checked. Raises ToolError naming each problem
    (nothing is sent then)."""
    if not items:
        return []
    workspace = gw.config.workspace_for(_agent_of(gw, session_key))
    local = []
    for item in items:
        if item.startswith(("http://", "https://")):
            local.append(await download_to_workspace(gw, workspace, item))
        else:
            local.append(item)
    paths, problems = attachments_for(workspace, channel, local, outbound_files(gw))
    if problems:
        raise ToolError("; ".join(problems))
    return paths


def _agent_of(gw, session_key: str | None) -> str:
    from gateway.routing import agent_of_key

    try:
        return agent_of_key(session_key or "")
    except ValueError:
        return gw.config.default_agent()


async def download_to_workspace(gw, workspace: Path, url: str) -> str:
    """Fetch ``url`` through the web fetch guard (SSRF checks, redirects, timeout) capped
    at ``media.max_bytes`` into ``downloads/``; returns the workspace-relative path.
    Raises ToolError."""
    from runtime.tools.web.fetch import FetchFailed, fetch_raw
    from runtime.tools.web.guard import FetchRefused

    settings = gw.config.tools.web.fetch.model_copy(
        update={"max_bytes": gw.config.media.max_bytes})
    try:
        fetched = await fetch_raw(url, settings)
    except FetchRefused as exc:
        log.warning("web_fetch_refused", url=url, reason=str(exc))
        raise ToolError(f"{url}: refused: {exc}") from None
    except FetchFailed as exc:
        raise ToolError(f"{url}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - aiohttp/timeouts: the model is told
        raise ToolError(f"{url}: {type(exc).__name__}: {exc}") from None
    if fetched.status >= 400:
        raise ToolError(f"{url}: HTTP {fetched.status}")
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "download"
    ref = await asyncio.to_thread(store_inbox, workspace, fetched.body, name,
                                  now=gw.clock.time(), folder="downloads")
    return ref.path
