"""The IMAP side of the email channel (``aioimaplib``): log in, select the folder, list
the UIDs above the checkpoint, fetch one mail, flag it seen, and wait for news with IDLE
(RFC 2177; a NOOP poll every ``poll_interval`` on a server without it).

Errors: :class:`LoginRejected` for a refused login (the adapter fails: retrying a wrong
password would only lock the account); any other failure (refused connection, timeout,
a dropped socket, a NO to SELECT) is an ``OSError``/``aioimaplib`` error that the adapter
answers with a reconnect after a backoff.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aioimaplib

from channels.tasks import cancel_and_wait

_UIDVALIDITY = re.compile(rb"\[UIDVALIDITY (\d+)\]")
_UIDNEXT = re.compile(rb"\[UIDNEXT (\d+)\]")
_FETCH_UID = re.compile(rb"\bUID (\d+)\b")


class LoginRejected(Exception):
    """The server refused the login (wrong user name or password)."""


class ImapFailed(ConnectionError):
    """The server answered NO/BAD to a command, or the connection was lost."""


@dataclass
class Mailbox:
    """One logged-in IMAP connection with ``name`` selected: ``uidvalidity`` and
    ``uidnext`` as the server announced them at SELECT; ``idle``: the server speaks IDLE.
    ``lost`` is set when the socket closes; ``news`` when the server announced a new
    message count (``* n EXISTS``) at any time, IDLE or not: aioimaplib drops an EXISTS
    that comes with another command's answer, and a mail arriving between the last
    SEARCH and the next IDLE would otherwise wait for the IDLE renewal."""

    client: Any
    name: str
    uidvalidity: int
    uidnext: int
    idle: bool
    lost: asyncio.Event
    news: asyncio.Event
    idled: bool = False

    async def _run(self, command: Any) -> Any:
        """Await one IMAP command, or raise ImapFailed as soon as the connection is
        lost (aioimaplib would wait for an answer that never comes until its timeout)."""
        return await _lost_or(self.lost, command)

    async def uids_after(self, uid: int) -> list[int]:
        """UIDs above ``uid``, ascending (clears ``news``: this answer covers it)."""
        self.news.clear()
        resp = await self._run(self.client.uid_search(f"UID {uid + 1}:*", charset=None))
        _ok(resp, "UID SEARCH")
        found = {int(t) for line in resp.lines[:-1] for t in bytes(line).split() if t.isdigit()}
        return sorted(u for u in found if u > uid)  # n:* always matches the highest UID

    async def uids_since(self, day: str) -> list[int]:
        """UIDs of mails that arrived on or after ``day`` (``03-Dec-2026``)."""
        resp = await self._run(self.client.uid_search(f"SINCE {day}", charset=None))
        _ok(resp, "UID SEARCH")
        return sorted({int(t) for line in resp.lines[:-1] for t in bytes(line).split()
                       if t.isdigit()})

    async def fetch(self, uid: int) -> bytes | None:
        """The whole mail ``uid`` (``BODY.PEEK[]``: not flagged seen by the fetch), or
        None when it is gone (expunged meanwhile)."""
        resp = await self._run(self.client.uid("fetch", str(uid), "(UID BODY.PEEK[])"))
        _ok(resp, "UID FETCH")
        for i, line in enumerate(resp.lines):
            if isinstance(line, bytes | bytearray) and b"FETCH" in line and \
                    (m := _FETCH_UID.search(bytes(line))) and int(m.group(1)) == uid:
                nxt = resp.lines[i + 1] if i + 1 < len(resp.lines) else None
                if isinstance(nxt, bytearray):
                    return bytes(nxt)
        return None

    async def mark_seen(self, uid: int) -> None:
        _ok(await self._run(self.client.uid("store", str(uid), "+FLAGS.SILENT (\\Seen)")),
            "UID STORE")

    async def wait_for_news(self, idle_timeout: float, poll_interval: float) -> None:
        """Return when the folder may have new mail: an IDLE push (EXISTS), or after
        ``idle_timeout`` (IDLE renewed) / ``poll_interval`` (no IDLE: NOOP). Raises
        ImapFailed when the connection is lost meanwhile."""
        if self.news.is_set():
            return
        if not self.idle:
            await _lost_or(self.lost, asyncio.sleep(poll_interval))
            _ok(await self._run(self.client.noop()), "NOOP")
            return
        self.idled = True
        waiting = await self._run(self.client.idle_start(timeout=idle_timeout))
        try:
            while True:
                push = await _lost_or(self.lost, self.client.wait_server_push(
                    idle_timeout + 5))
                if push == aioimaplib.STOP_WAIT_SERVER_PUSH or any(
                        b"EXISTS" in bytes(line) for line in push
                        if isinstance(line, bytes | bytearray)):
                    break
        finally:
            if self.client.has_pending_idle() and not self.lost.is_set():
                self.client.idle_done()
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(waiting, 10)
            if not waiting.done():
                waiting.cancel()

    async def close(self) -> None:
        """LOGOUT, then close the socket. A live connection that has been in IDLE is
        closed at once: aioimaplib never sees the LOGOUT answer after an IDLE (it would
        wait the whole timeout, 2 s of every stop). A lost one keeps the old 2 s
        LOGOUT wait: it is also the pause before the reconnect."""
        if not (self.idled and not self.lost.is_set()):
            with suppress(Exception):
                await asyncio.wait_for(self.client.logout(), 2)
        transport = getattr(self.client.protocol, "transport", None)
        if transport is not None:
            transport.close()


async def _lost_or(lost: asyncio.Event, work: Any) -> Any:
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(lost.wait())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        await cancel_and_wait(task)
        raise ImapFailed("connection to the IMAP server lost")
    return task.result()


def _ok(resp: Any, what: str) -> Any:
    if getattr(resp, "result", None) != "OK":
        lines = b" ".join(bytes(x) for x in getattr(resp, "lines", [])
                          if isinstance(x, bytes | bytearray))[:200]
        raise ImapFailed(f"{what}: {getattr(resp, 'result', '?')} "
                         f"{lines.decode('utf-8', 'replace')}".strip())
    return resp


def tls_context(cfg: Any) -> ssl.SSLContext:
    """The client TLS context of both servers: certificates and host names verified,
    against ``cfg.tls_ca_file`` when set, else the system's CAs. Raises OSError/SSLError
    for an unreadable CA file."""
    ca = getattr(cfg, "tls_ca_file", None)
    return ssl.create_default_context(cafile=str(Path(ca).expanduser()) if ca else None)


async def _starttls(client: Any, cfg: Any) -> None:
    """RFC 3501 STARTTLS before the login: refused (ImapFailed) when the server does not
    offer it (no silent fall-back to plain text), then the capabilities asked again over
    TLS (the ones sent before are not trusted)."""
    proto = client.protocol
    if "STARTTLS" not in proto.capabilities:
        raise ImapFailed("the IMAP server does not offer STARTTLS (imap_security: starttls); "
                         "use imap_security: tls on its TLS port")
    _ok(await proto.execute(aioimaplib.Command("STARTTLS", proto.new_tag(), loop=proto.loop)),
        "STARTTLS")
    proto.transport = await proto.loop.start_tls(proto.transport, proto, tls_context(cfg),
                                                 server_hostname=cfg.imap_host)
    await proto.capability()


async def open_mailbox(cfg: Any, *, username: str, password: str) -> Mailbox:
    """Connect to ``cfg.imap_host``:``cfg.imap_port`` (implicit TLS, STARTTLS or plain per
    ``imap_security``; certificates verified, see :func:`tls_context`), log in and select
    ``cfg.mailbox``. Raises LoginRejected, ImapFailed, OSError (ssl.SSLError for a
    certificate that does not verify) or TimeoutError."""
    lost = asyncio.Event()
    timeout = float(cfg.connect_timeout)
    if cfg.imap_security == "tls":
        client = aioimaplib.IMAP4_SSL(cfg.imap_host, cfg.imap_port, timeout=timeout,
                                      ssl_context=tls_context(cfg))
        client.protocol.conn_lost_cb = lambda _exc: lost.set()
    else:
        client = aioimaplib.IMAP4(cfg.imap_host, cfg.imap_port, timeout=timeout,
                                  conn_lost_cb=lambda _exc: lost.set())
    news = asyncio.Event()
    untagged = client.protocol._untagged_response

    def watch(line: bytes) -> Any:  # every untagged line passes here (Mailbox.news)
        if line.rstrip().endswith(b" EXISTS"):
            news.set()
        return untagged(line)

    client.protocol._untagged_response = watch
    try:
        await client.wait_hello_from_server()
        if cfg.imap_security == "starttls":
            await asyncio.wait_for(_starttls(client, cfg), timeout)
        resp = await client.login(username, password)
        if resp.result != "OK":
            raise LoginRejected(" ".join(bytes(x).decode("utf-8", "replace")
                                         for x in resp.lines)[:200] or "login refused")
        selected = _ok(await client.select(cfg.mailbox), f"SELECT {cfg.mailbox}")
    except BaseException:
        transport = getattr(client.protocol, "transport", None)
        if transport is not None:
            transport.close()
        raise
    text = b"\n".join(bytes(x) for x in selected.lines if isinstance(x, bytes | bytearray))
    validity, nxt = _UIDVALIDITY.search(text), _UIDNEXT.search(text)
    if validity is None:
        raise ImapFailed(f"SELECT {cfg.mailbox}: no UIDVALIDITY in the answer")
    return Mailbox(client=client, name=cfg.mailbox, uidvalidity=int(validity.group(1)),
                   uidnext=int(nxt.group(1)) if nxt else 0,
                   idle=client.has_capability("IDLE"), lost=lost, news=news)
