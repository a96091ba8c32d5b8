"""``tidegate agent -m TEXT`` and ``tidegate chat``: one turn, or a conversation, through
the running gateway's ``/api/agent/stream``.

``agent -m`` prints the reply on stdout (nothing for a silent ``NO_REPLY``; ``chat``
shows nothing for that turn) and what the turn is waiting for on stderr
("waiting for openai/gpt-4o… retry 2/3 in 4 s"), unless ``--quiet``. ``chat`` streams the
reply as it arrives, with line editing and history (GNU readline, history in
``<state_dir>/cli_history``, mode 0600; absent readline degrades to plain input).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gateway.cli.output import print_json
from gateway.config.load import LoadedConfig

HISTORY_LINES = 1000


def _client(loaded: LoadedConfig) -> Any:
    from gateway.cli.client import ControlClient
    return ControlClient.from_config(loaded)


def run_turn(client: Any, body: dict[str, Any], *, on_delta: Callable[[str], None],
             on_progress: Callable[[str], None],
             on_round_end: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Stream one turn; returns the final ``result`` object, its ``reply`` as delivered
    (``""`` and ``silent: true`` for a ``NO_REPLY``, README "Silent replies"); deltas pass
    the same rules. Raises GatewayUnavailable / ApiError (gateway.cli.client) or
    RuntimeError when the stream ends without a result."""
    from channels.outbound.silent import SilentStream
    shown = SilentStream()

    def delta(text: str) -> None:
        if text:
            on_delta(text)
    for line in client.stream("/api/agent/stream", body):
        kind = line.get("type")
        if kind == "delta":
            delta(shown.push(line.get("text", "")))
        elif kind == "progress":
            on_progress(line.get("text", ""))
        elif kind == "round_end":
            delta(shown.round_end())
            on_round_end()
        elif kind == "attempt":  # a second one: the turn re-run after a takeover
            shown.attempt()
        elif kind == "result":
            rest = shown.end(line.get("reply") or "")
            if shown.pushed:  # else the caller prints the reply itself
                delta(rest)
            return {**line, "reply": shown.reply, "silent": shown.silent}
    raise RuntimeError("the gateway closed the stream before the turn ended")


def cmd_agent(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.cli.client import ApiError, GatewayUnavailable
    body = {"message": args.message, "session_key": args.session_key, "to": args.to,
            "agent": args.agent}
    quiet = args.quiet or args.json

    def progress(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)
    try:
        out = run_turn(_client(loaded), body, on_delta=lambda _: None, on_progress=progress)
    except (GatewayUnavailable, ApiError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json({k: out.get(k) for k in ("session_key", "session_id", "reply", "run_id",
                                             "status", "silent")})
    elif not out.get("silent"):  # a silent reply prints nothing
        print(out.get("reply", ""))
    return 0 if out.get("status") in ("ok", None) else 1


class _Readline:
    """Line editing and a private history file, when GNU readline is available."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            import readline
        except ImportError:  # e.g. a Python built without it
            self.rl = None
            return
        self.rl = readline
        readline.set_history_length(HISTORY_LINES)
        try:
            readline.read_history_file(str(path))
        except (FileNotFoundError, OSError):
            pass

    def save(self) -> None:
        if self.rl is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.rl.write_history_file(str(self.path))
            os.chmod(self.path, 0o600)  # what you typed to the agent is private
        except OSError:
            pass


def cmd_chat(args: argparse.Namespace, loaded: LoadedConfig, *,
             out: TextIO | None = None) -> int:
    from gateway.cli.client import ApiError, GatewayUnavailable
    out = out or sys.stdout
    client = _client(loaded)
    history = _Readline(loaded.state_dir / "cli_history")
    print("tidegate chat — /new for a fresh session, /exit or Ctrl-D to leave.", file=out)
    try:
        while True:
            try:
                text = input("you> ").strip()
            except (EOFError, KeyboardInterrupt):
                print(file=out)
                return 0
            if not text:
                continue
            if text in ("/exit", "/quit"):
                return 0
            body = {"message": text, "session_key": args.session_key, "to": args.to,
                    "agent": args.agent}
            try:
                _chat_turn(client, body, out)
            except (GatewayUnavailable, ApiError, RuntimeError) as exc:
                print(f"error: {exc}", file=sys.stderr)
    finally:
        history.save()


def _chat_turn(client: Any, body: dict[str, Any], out: TextIO) -> None:
    state = {"streamed": False}

    def delta(text: str) -> None:
        if not state["streamed"]:
            out.write("agent> ")
            state["streamed"] = True
        out.write(text)
        out.flush()

    def round_end() -> None:
        if state["streamed"]:
            out.write("\n")
            state["streamed"] = False

    def progress(text: str) -> None:
        print(f"  … {text}", file=sys.stderr, flush=True)

    result = run_turn(client, body, on_delta=delta, on_progress=progress,
                      on_round_end=round_end)
    if state["streamed"]:
        out.write("\n")
    elif result.get("reply"):
        # Nothing streamed (a /command, or a provider that does not stream): print it.
        out.write(f"agent> {result['reply']}\n")
    out.flush()
