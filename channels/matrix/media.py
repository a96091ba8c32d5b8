"""Matrix media: downloads of ``mxc://`` files through the media pipeline's capped fetch,
and uploads of outbound files as ``m.image`` / ``m.audio`` / ``m.video`` / ``m.file``.

Downloads use the authenticated media API (``GET /_matrix/client/v1/media/download/
{server}/{media_id}``, spec v1.11; Synapse requires it for new media since 1.120) with the
access token as a bearer header, so a file never lands in memory past ``media.max_bytes``
(channels/media/download.py). Uploads go through matrix-nio's ``upload`` (``POST
/_matrix/media/v3/upload``), then one room event names the ``mxc://`` uri.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any
from urllib.parse import quote

from channels.media.download import fetch_capped
from channels.media.outbound import upload_kind
from channels.outbound.delivery import DeliveryError

_MSGTYPE = {"photo": "m.image", "voice": "m.audio"}


def download_url(homeserver: str, mxc: str) -> str:
    """The authenticated download URL of ``mxc://<server>/<media id>``. Raises ValueError
    for anything else."""
    rest = mxc.removeprefix("mxc://")
    server, _, media_id = rest.partition("/")
    if not mxc.startswith("mxc://") or not server or not media_id or "/" in media_id:
        raise ValueError(f"not an mxc:// uri: {mxc!r}")
    return (f"{homeserver.rstrip('/')}/_matrix/client/v1/media/download/"
            f"{quote(server, safe='')}/{quote(media_id, safe='')}")


def fetcher_for(homeserver: str, token: str, mxc: str, name: str, *, timeout: float):
    """``fetch(max_bytes)`` of one file (``InboundMedia.fetch``); the token only ever
    travels in the Authorization header."""
    async def fetch(max_bytes: int) -> bytes:
        return await fetch_capped(download_url(homeserver, mxc), name=name,
                                  max_bytes=max_bytes, timeout=timeout,
                                  headers={"Authorization": f"Bearer {token}"})
    return fetch


def _msgtype(path: Path, mime: str) -> str:
    kind, _ = upload_kind(path)
    if kind in _MSGTYPE:
        return _MSGTYPE[kind]
    if mime.startswith("video/"):
        return "m.video"
    if mime.startswith("audio/"):
        return "m.audio"
    return "m.file"


async def upload_file(client: Any, path: Path) -> dict[str, Any]:
    """Upload ``path`` and return the content of the room event that shows it. Raises
    DeliveryError (retryable for 429/5xx or transport trouble)."""
    from nio import UploadResponse

    _, mime = await asyncio.to_thread(upload_kind, path)
    data = await asyncio.to_thread(path.read_bytes)
    resp, _ = await client.upload(io.BytesIO(data), content_type=mime, filename=path.name,
                                  filesize=len(data))
    if not isinstance(resp, UploadResponse):
        status = getattr(getattr(resp, "transport_response", None), "status", None)
        raise DeliveryError(f"upload of {path.name} refused: {getattr(resp, 'message', resp)}",
                            retryable=status is None or status >= 500 or status == 429)
    msgtype = await asyncio.to_thread(_msgtype, path, mime)
    return {"msgtype": msgtype, "body": path.name, "filename": path.name,
            "url": resp.content_uri, "info": {"mimetype": mime, "size": len(data)}}
