"""Files on Slack: ``files`` of a message event -> ``InboundMedia`` (downloaded from
``url_private_download`` with the bot token, scope ``files:read``), and uploads with
``files_upload_v2`` into the conversation/thread (scope ``files:write``; Slack's
getUploadURLExternal -> upload -> completeUploadExternal flow).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import DeliveryResult
from channels.media import InboundMedia
from channels.media.download import fetch_capped
from channels.media.outbound import files_failed, upload_problem
from channels.slack.api import NETWORK_ERRORS, api_failure, describe_error

log = structlog.get_logger(__name__)


def media_of(event: dict[str, Any], bot_token: str, api_base_url: str) -> list[InboundMedia]:
    """The downloadable files of a message event (tombstoned/external files skipped, and
    files whose URL is not on Slack's file host or the configured API host: the bot token
    is only ever sent there)."""
    out = []
    for f in event.get("files") or []:
        if not isinstance(f, dict):
            continue
        url = f.get("url_private_download") or f.get("url_private")
        if not isinstance(url, str) or f.get("mode") in ("tombstone", "external"):
            continue
        if not token_host(url, api_base_url):
            log.warning("slack_file_url_refused", file_id=f.get("id"),
                        host=urlsplit(url).hostname)
            continue
        mime = str(f.get("mimetype") or "")
        kind = "image" if mime.startswith("image/") else "audio" if mime.startswith(
            "audio/") else "document"
        size = f.get("size")
        out.append(InboundMedia(kind=kind, name=str(f.get("name") or f.get("id") or "file"),
                                size=size if isinstance(size, int) else None, mime=mime,
                                fetch=_fetcher(url, bot_token, str(f.get("name") or "file"))))
    return out


def token_host(url: str, api_base_url: str) -> bool:
    """True when ``url`` is https on ``*.slack.com`` or on the host:port of the configured
    ``api_base_url`` (the fake in tests, an enterprise proxy)."""
    parts, api = urlsplit(url), urlsplit(api_base_url)
    if parts.scheme == "https" and (parts.hostname or "").endswith(".slack.com"):
        return True
    return (parts.scheme, parts.netloc) == (api.scheme, api.netloc)


def _fetcher(url: str, token: str, name: str):
    async def fetch(max_bytes: int) -> bytes:
        return await fetch_capped(url, name=name, max_bytes=max_bytes,
                                  headers={"Authorization": f"Bearer {token}"})
    return fetch


async def upload_files(web: AsyncWebClient, files: list[str], *, channel: str,
                       thread_ts: str | None, result: DeliveryResult) -> DeliveryResult:
    """Upload each file into ``channel``/``thread_ts`` after the text went out (``result``).
    Limits are checked before the first upload; a failure stops the rest and says which
    files are left (the outbox retries only those)."""
    problems = [p for p in (upload_problem("slack", Path(f)) for f in files) if p]
    if problems:
        return DeliveryResult(ok=False, retryable=False, error="; ".join(problems))
    for i, name in enumerate(files):
        path = Path(name)
        try:
            resp = await web.files_upload_v2(channel=channel, thread_ts=thread_ts,
                                             file=str(path), filename=path.name,
                                             title=path.name)
        except SlackApiError as exc:
            failure = api_failure(exc)
            return files_failed(result.message_ids, files[i:], error=failure.describe(),
                                retryable=failure.transient and not failure.auth)
        except NETWORK_ERRORS as exc:
            return files_failed(result.message_ids, files[i:], error=describe_error(exc),
                                retryable=True)
        file_info = resp.get("file") or {}
        result.message_ids.append(str(file_info.get("id") or path.name))
    return result
