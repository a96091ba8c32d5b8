"""The generator: a seeded plan of messages to random sessions through random surfaces
and replicas, executed in real time by a few client threads; every operation's result is
recorded in the history (:class:`Op`).

Surfaces: ``telegram`` (a user message injected into the fake Bot API; its reply arrives
later in the chat), ``openai`` (``POST /v1/chat/completions`` on a replica with the
session's key in ``X-Session-Key``; the reply is the response), ``openai-stream`` (the
same with ``stream: true``: the reply is the concatenated deltas, so a delta sent twice
across a takeover shows as a wrong reply), ``cli`` (``tidegate agent
-m --session-key KEY --json`` with a replica's config). Status: ``ok`` (reply received),
``fail`` (certainly not accepted: connection refused, no gateway, a 4xx), ``info``
(indeterminate: a timeout, a reset or a 5xx after the request went out), ``sent`` (a
Telegram message: its fate is read from the chat afterwards).
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.cluster_check.cluster import CHAT0, Cluster, key_of

SURFACES = {"telegram": 0.45, "openai": 0.25, "openai-stream": 0.15, "cli": 0.15}


@dataclass
class Op:
    """One message. ``at``: planned offset from the run's start (s); ``sent``/``done``:
    epoch seconds; ``tg_id``: the Telegram message id (telegram surface)."""

    id: int
    session: int
    surface: str
    replica: str
    at: float
    sent: float = 0.0
    done: float = 0.0
    status: str = "planned"
    reply: str = ""
    detail: str = ""
    tg_id: int | None = None

    @property
    def text(self) -> str:
        return f"chk s{self.session} m{self.id}"


def plan(rng: random.Random, duration: float, replicas: list[str], *, sessions: int,
         rate: float, surfaces: dict[str, float] | None = None) -> list[Op]:
    """The seeded plan: Poisson arrivals at ``rate`` messages/s over ``duration`` s."""
    weights = surfaces or SURFACES
    names, w = list(weights), list(weights.values())
    ops, t, n = [], rng.expovariate(rate), 1
    while t < duration:
        ops.append(Op(id=n, session=rng.randrange(sessions), surface=rng.choices(names, w)[0],
                      replica=rng.choice(replicas), at=t))
        n += 1
        t += rng.expovariate(rate)
    return ops


def _openai(cluster: Cluster, op: Op, timeout: float, stream: bool = False) -> None:
    p = cluster.replicas[op.replica]
    try:
        port, token = p.port, p.token
    except (OSError, ValueError, KeyError) as exc:  # not running: no gateway.json
        op.status, op.detail = "fail", f"no gateway: {exc}"
        return
    body = json.dumps({"model": "tidegate", "user": f"s{op.session}", "stream": stream,
                       "messages": [{"role": "user", "content": op.text}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json",
                                          "X-Session-Key": key_of(op.session)})
    op.sent = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            op.reply = _deltas(r) if stream else \
                json.loads(r.read())["choices"][0]["message"]["content"] or ""
        op.status = "ok"
    except urllib.error.HTTPError as exc:
        op.status = "fail" if exc.code < 500 else "info"
        op.detail = f"HTTP {exc.code}: {exc.read()[:200]!r}"
    except urllib.error.URLError as exc:
        refused = isinstance(exc.reason, ConnectionRefusedError)
        op.status, op.detail = ("fail" if refused else "info"), f"{exc.reason}"
    except (OSError, ValueError, KeyError) as exc:  # reset, timeout, bad JSON
        op.status, op.detail = "info", f"{type(exc).__name__}: {exc}"
    op.done = time.time()


def _deltas(response) -> str:
    """The text of a streamed chat completion (server-sent events); raises ValueError
    when the stream ends before ``[DONE]``."""
    text = []
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return "".join(text)
        chunk = json.loads(data)
        if chunk.get("error"):
            raise ValueError(f"stream error: {chunk['error']}")
        for choice in chunk.get("choices") or []:
            text.append((choice.get("delta") or {}).get("content") or "")
    raise ValueError("the stream ended before [DONE]")


def _cli(cluster: Cluster, op: Op, timeout: float) -> None:
    p = cluster.replicas[op.replica]
    op.sent = time.time()
    try:
        r = p.cli("agent", "-m", op.text, "--session-key", key_of(op.session), "--json",
                  "-q", timeout=timeout, check=False)
    except Exception as exc:  # noqa: BLE001 - a timeout: indeterminate
        op.status, op.detail, op.done = "info", f"{type(exc).__name__}", time.time()
        return
    op.done = time.time()
    try:
        out = json.loads(r.stdout)
    except ValueError:
        out = None
    if r.returncode == 0 and isinstance(out, dict):
        op.status, op.reply = "ok", str(out.get("reply") or "")
        return
    err = (r.stderr or r.stdout).strip()[-300:]
    unreachable = any(x in err.lower() for x in ("not running", "refused", "unavailable",
                                                 "has exited"))
    op.status, op.detail = ("fail" if unreachable else "info"), f"exit {r.returncode}: {err}"


def _telegram(cluster: Cluster, op: Op) -> None:
    chat = CHAT0 + op.session
    op.sent = time.time()
    update = cluster.bot.call(cluster.bot.fake.inject_message, op.text, chat_id=chat,
                              user_id=chat)
    op.tg_id = update["message"]["message_id"]
    op.status, op.done = "sent", op.sent


def execute(cluster: Cluster, op: Op, timeout: float = 90.0) -> None:
    """Send ``op`` through its surface; fills in its result."""
    if op.surface == "telegram":
        _telegram(cluster, op)
    elif op.surface in ("openai", "openai-stream"):
        _openai(cluster, op, timeout, stream=op.surface == "openai-stream")
    else:
        _cli(cluster, op, timeout)


def run_plan(cluster: Cluster, ops: list[Op], t0: float, stop: threading.Event,
             workers: int = 6) -> None:
    """Send every op at ``t0 + op.at`` (epoch s) on ``workers`` client threads; returns
    when all have finished (or ``stop`` is set: the rest stay ``planned``)."""
    with ThreadPoolExecutor(workers, thread_name_prefix="client") as pool:
        for op in ops:
            delay = t0 + op.at - time.time()
            if delay > 0 and stop.wait(delay):
                break
            pool.submit(execute, cluster, op)


def message_ids_of(text: str) -> list[int]:
    """Message ids named in a reply ``text``."""
    from tests.cluster_check.model import message_ids
    return message_ids(text)
