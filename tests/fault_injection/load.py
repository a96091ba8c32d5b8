"""The load: a seeded plan of messages over five surfaces, sent in real time by a few
client threads; each message's fate as the sender saw it is kept in its :class:`Msg`.

Surfaces: ``telegram``, ``slack``, ``discord`` (a DM injected into the fake platform,
which holds it until the gateway takes it: always accepted; its reply shows in the chat),
``openai`` (``POST /v1/chat/completions``, one session per message via ``user``) and
``webchat`` (the ``/ws`` WebSocket, one client id per message). A local request that
finds the gateway down is retried, as a client would, for up to ``RETRY_FOR`` seconds.
Local status: ``ok`` (an answer), ``error`` (an OpenAI error object or a webchat error
frame: the gateway answered, it failed), ``lost`` (the connection broke with no answer:
the gateway died while the request was in flight), ``refused`` (never reached it).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import aiohttp

from tests.fault_injection.model import POISON
from tests.fault_injection.system import DISCORD_USERS, SLACK_USERS, TG_USERS, System

SURFACES = ("telegram", "slack", "discord", "openai", "webchat")
PLATFORMS = ("telegram", "slack", "discord")
RETRY_FOR = 30.0  # s


@dataclass
class Msg:
    """One planned message. ``at``: offset from the run's start (s); ``user``: the
    sender on its platform; ``platform_id``: the message's id as its outcome row names it
    (Telegram ``<chat>:<message_id>``, Slack ``<channel>:<ts>``, Discord snowflake)."""

    id: int
    surface: str
    user: str
    at: float
    poison: bool = False
    sent: float = 0.0
    status: str = "planned"
    platform_id: str = ""
    reply: str = ""
    detail: str = ""

    @property
    def text(self) -> str:
        body = f"{POISON} please" if self.poison else "hello"
        return f"fi-m{self.id} {body}"

    @property
    def client(self) -> str:
        return f"fi-m{self.id}"


def plan(rng: random.Random, n: int, duration: float, poison_at: float) -> list[Msg]:
    """``n`` messages at uniform random offsets in ``[0, duration)``, surfaces in turn
    (equal shares, shuffled), plus the poison (a Telegram DM) at ``poison_at``."""
    surfaces = [SURFACES[i % len(SURFACES)] for i in range(n)]
    rng.shuffle(surfaces)
    times = sorted(rng.uniform(0, duration) for _ in range(n))
    users = {"telegram": [str(u) for u in TG_USERS], "slack": list(SLACK_USERS),
             "discord": list(DISCORD_USERS), "openai": ["-"], "webchat": ["-"]}
    out = [Msg(i + 1, s, rng.choice(users[s]), t) for i, (s, t) in
           enumerate(zip(surfaces, times, strict=True))]
    out.append(Msg(n + 1, "telegram", "6109", poison_at, poison=True))
    return sorted(out, key=lambda m: m.at)


def _telegram(sys: System, m: Msg) -> None:
    u = int(m.user)
    update = sys.tg.call(sys.tg.fake.inject_message, m.text, chat_id=u, user_id=u)
    m.platform_id, m.status = f'{u}:{update["message"]["message_id"]}', "sent"


def _slack(sys: System, m: Msg) -> None:
    event = sys.slack.fake.dm(m.text, user=m.user)
    m.platform_id, m.status = f'{event["channel"]}:{event["ts"]}', "sent"
    try:
        sys.on_loop(sys.slack, sys.slack.fake.push_event(event))
    except (ConnectionError, OSError, RuntimeError) as exc:
        # written to the socket of a gateway dying at that instant: Slack holds the
        # envelope and retries it (the fake's redeliver_after, set by System), as it does
        # an unacked one
        m.detail = f"first delivery failed: {type(exc).__name__}"


def _discord(sys: System, m: Msg) -> None:
    user = getattr(sys.dc.fake, m.user)
    d = sys.on_loop(sys.dc, sys.dc.fake.send_dm(m.text, user=user))
    m.platform_id, m.status = str(d["id"]), "sent"


def _openai_once(port: int, token: str, m: Msg) -> str:
    body = json.dumps({"model": "tidegate", "user": m.client,
                       "messages": [{"role": "user", "content": m.text}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=90) as r:
            m.reply = json.loads(r.read())["choices"][0]["message"]["content"] or ""
            return "ok"
    except urllib.error.HTTPError as exc:
        m.detail = f"HTTP {exc.code}: {exc.read()[:200]!r}"
        return "error"
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return "refused"
        m.detail = str(exc.reason)
        return "lost"
    except (OSError, ValueError) as exc:  # reset, bad JSON
        m.detail = f"{type(exc).__name__}: {exc}"
        return "lost"


async def _webchat_once(port: int, token: str, m: Msg) -> str:
    url = f"http://127.0.0.1:{port}/ws?token={token}&client={m.client}"
    try:
        async with aiohttp.ClientSession() as s, s.ws_connect(url) as ws:
            await ws.send_json({"type": "message", "text": m.text})
            async for frame in ws:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    break
                data = json.loads(frame.data)
                if data.get("type") == "reply":
                    m.reply = str(data.get("text") or "")
                    return "ok"
                if data.get("type") == "error":
                    m.detail = str(data.get("error"))[:200]
                    return "error"
            m.detail = "the socket closed with no reply"
            return "lost"
    except aiohttp.ClientConnectorError:
        return "refused"
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        m.detail = f"{type(exc).__name__}: {exc}"
        return "lost"


def _local(sys: System, m: Msg) -> None:
    deadline = time.monotonic() + RETRY_FOR
    while True:
        where = sys.port_token()
        if where is not None:
            m.sent = time.time()
            status = _openai_once(*where, m) if m.surface == "openai" else \
                asyncio.run(_webchat_once(*where, m))
            if status != "refused":
                m.status = status
                return
        if time.monotonic() > deadline:
            m.status = "refused"
            return
        time.sleep(0.2)


SENDERS = {"telegram": _telegram, "slack": _slack, "discord": _discord,
           "openai": _local, "webchat": _local}


def send(sys: System, m: Msg) -> None:
    m.sent = time.time()
    try:
        SENDERS[m.surface](sys, m)
    except Exception as exc:  # noqa: BLE001 - a harness failure, reported by the check
        m.status, m.detail = "harness-error", f"{type(exc).__name__}: {exc}"


def run_plan(sys: System, msgs: list[Msg], t0: float, stop: threading.Event,
             workers: int = 8) -> None:
    """Send each message at ``t0 + at`` on ``workers`` threads; returns when all ended."""
    with ThreadPoolExecutor(workers, thread_name_prefix="client") as pool:
        for m in msgs:
            delay = t0 + m.at - time.time()
            if delay > 0 and stop.wait(delay):
                break
            pool.submit(send, sys, m)
