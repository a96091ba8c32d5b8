"""``tidegate status [--json]``: the running gateway's status, and the config file's
problems beside it.

The gateway is found through the ``gateway`` section alone, so a section broken since the
gateway loaded the file does not hide the answer (exit 0 when the gateway answers, 1 when
it does not); the file's problems are printed after the status (``config_file_problems``
in the JSON).
"""

from __future__ import annotations

import argparse
import sys

from gateway.cli.output import print_json
from gateway.config.load import ConfigError, LoadedConfig, load_config


def _client(loaded: LoadedConfig):
    from gateway.cli.client import ControlClient
    return ControlClient.from_config(loaded)


def cmd_status(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    """The running gateway's status (found through the ``gateway`` section alone), plus
    what is wrong in the config file now: the gateway answers with the config it loaded,
    so a section broken since is reported, not fatal."""
    from gateway.cli.client import ApiError, GatewayUnavailable
    file_problems = _config_file_problems(args)
    try:
        status = _client(loaded).request("GET", "/status", timeout=10)
    except GatewayUnavailable as exc:
        if _print_waiting(loaded, args.json, file_problems):
            return 1
        if args.json:
            print_json({"ok": False, "running": False, "error": str(exc),
                        "config_file_problems": file_problems})
        else:
            print(f"gateway: not running ({exc})")
            _print_file_problems(loaded, file_problems, running=False)
        return 1
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    status["running"] = True
    if args.json:
        print_json({**status, "config_file_problems": file_problems})
        return 0
    from gateway.cli.output import render_status
    print(render_status(status))
    _print_file_problems(loaded, file_problems, running=True)
    return 0


def _print_waiting(loaded: LoadedConfig, as_json: bool, file_problems: list[str]) -> bool:
    """A gateway of this state dir that is starting and waits for PostgreSQL
    (gateway/service/waiting.py): say so; False when there is none."""
    import time

    from gateway.service.waiting import read_waiting
    state = read_waiting(loaded.state_dir)
    if state is None:
        return False
    if as_json:
        print_json({"ok": False, "running": True, "state": "waiting for PostgreSQL",
                    "waiting": state, "config_file_problems": file_problems})
        return True
    waited = round(time.time() - float(state.get("since") or time.time()))
    print(f"gateway: starting (pid {state.get('pid')}), waiting for PostgreSQL for {waited}s "
          f"({state.get('attempts')} attempts; last: {state.get('last_error')})")
    _print_file_problems(loaded, file_problems, running=False)
    return True


def _config_file_problems(args: argparse.Namespace) -> list[str]:
    """What the whole config file fails on now ([] when it loads); unset ``${VAR}``s
    are not counted (the running gateway has its secrets)."""
    try:
        load_config(args.config, strict_env=False, env_file=args.env_choice)
    except ConfigError as exc:
        return exc.problems
    return []


def _print_file_problems(loaded: LoadedConfig, problems: list[str], *, running: bool) -> None:
    if not problems:
        return
    where = loaded.path or "the config file"
    tail = ("the running gateway keeps the config it loaded; a reload or restart would "
            "refuse this file" if running else "the gateway would refuse to start")
    if running and _fallback(loaded):
        tail = ("the running gateway keeps the config it loaded; a reload keeps it too; a "
                "new start (systemctl restart) runs on the last-known-good config "
                "(config.on_invalid: lkg), while `tidegate gateway restart` refuses")
    print(f"config file {where} is invalid ({tail}):")
    for line in problems:
        print(f"  {line}")


def _fallback(loaded: LoadedConfig) -> bool:
    """True when the (broken) config file asks for the last-known-good copy."""
    from gateway.config.lkg import on_invalid_mode
    try:
        return loaded.path is not None and on_invalid_mode(loaded.path, None) == "lkg"
    except ConfigError:
        return False
