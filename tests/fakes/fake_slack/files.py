"""Files: private downloads, the external upload flow (getUploadURLExternal, upload,
completeUploadExternal), and echoing the bot's posts back as events."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from tests.fakes.fake_slack.wire import _err, _ok, channel_type_of


class FileRoutes:
    """Mixed into ``FakeSlack`` (tests/fakes/fake_slack/__init__.py), whose state it
    uses."""

    def add_file(self, name: str, data: bytes, mimetype: str,
                 size: int | None = None) -> dict[str, Any]:
        """A file object as message events carry it; downloadable from
        ``url_private_download`` with the bot token only. ``size`` overrides the
        announced size."""
        fid = f"F{len(self.files) + 1:07d}"
        self.files[fid] = data
        url = f"{self.url}/files-pri/{self.team_id}-{fid}/download/{name}"
        return {"id": fid, "name": name, "title": name, "mimetype": mimetype,
                "filetype": name.rsplit(".", 1)[-1], "size": len(data) if size is None
                else size, "mode": "hosted", "url_private": url,
                "url_private_download": url}

    def hold_downloads(self, held: bool = True) -> None:
        """A slow file host: downloads are answered only once released
        (``hold_downloads(False)``)."""
        if held:
            self._downloads_open = asyncio.Event()
        elif self._downloads_open is not None:
            self._downloads_open.set()
            self._downloads_open = None

    async def _file_download(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        self.file_downloads.append({"path": request.path, "auth": auth})
        if self._downloads_open is not None:
            await self._downloads_open.wait()
        if auth != f"Bearer {self.bot_token}":
            # what Slack does without a valid token: a login page, not the file
            return web.Response(text="<html>sign in</html>", content_type="text/html")
        fid = request.match_info["tail"].split("/", 1)[0].split("-", 1)[-1]
        data = self.files.get(fid)
        return web.Response(body=data, content_type="application/octet-stream") \
            if data is not None else web.Response(status=404)

    def _get_upload_url(self, args: dict[str, Any]) -> web.Response:
        if not args.get("filename") or not str(args.get("length") or "").isdigit():
            return _err("invalid_arguments")
        fid = f"F{len(self.files) + len(self.pending_uploads) + 1:07d}U"
        self.pending_uploads[fid] = {"filename": args["filename"],
                                     "length": int(args["length"]), "data": None}
        return _ok({"upload_url": f"{self.url}/upload/{fid}", "file_id": fid})

    async def _file_upload(self, request: web.Request) -> web.Response:
        up = self.pending_uploads.get(request.match_info["file_id"])
        if up is None:
            return web.Response(status=404)
        up["data"] = await request.read()
        return web.Response(text="OK - " + str(len(up["data"])))

    def _complete_upload(self, args: dict[str, Any]) -> web.Response:
        files = args.get("files")
        if isinstance(files, str):
            files = json.loads(files)
        done = []
        for f in files or []:
            up = self.pending_uploads.pop(str(f.get("id")), None)
            if up is None or up["data"] is None:
                return _err("file_not_found")
            self.uploads.append({"channel": args.get("channel_id"),
                                 "thread_ts": args.get("thread_ts"),
                                 "filename": up["filename"], "data": up["data"]})
            done.append({"id": f["id"], "name": up["filename"], "title": f.get("title")})
        return _ok({"files": done})

    async def _echo(self, body: dict[str, Any]) -> None:
        # Slack delivers the bot's own posts back as message events; adapters must drop them.
        msg = dict(body["message"])
        channel = body["channel"]
        msg.update({"channel": channel, "channel_type": channel_type_of(channel),
                    "event_ts": msg["ts"]})
        await self.push_event(msg)
