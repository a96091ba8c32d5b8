"""``tidegate cron`` (issue 4; DESIGN.md "Scheduler", seed 001 §9.3-9.4).

The commands go through the running gateway's control API (``/api/cron...``, see
gateway/server/scheduler_api.py), because the daemon owns the job store while it runs and
would write its in-memory copy over any outside edit. When the gateway is not running they
work on the store directly, inside ``CronStore.transaction()`` (an exclusive lock across
read-modify-write, atomic replace), and the daemon picks the jobs up when it starts. ``cron
run`` needs the gateway.

The parser and the dispatch are here; ``change.py`` adds, edits, toggles and removes jobs,
``view.py`` lists them, runs one and shows its run log, ``store.py`` is the store when the
gateway is down, ``format.py`` how a schedule prints.

Exit codes: 0 ok, 1 failure (gateway needed but down, unknown job, API error), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from gateway.cli.cron.change import cron_add, cron_edit, cron_rm, cron_toggle
from gateway.cli.cron.view import cron_list, cron_run, cron_runs
from gateway.cli.scheduler import CliError
from gateway.config.load import LoadedConfig


def register(sub: Any) -> None:
    """Add ``cron`` to the CLI's subparsers (gateway/cli/main.py)."""
    c = sub.add_parser("cron", help="scheduled jobs: add, edit, list, run, enable/disable, "
                       "remove")
    csub = c.add_subparsers(dest="cron_cmd", required=True, metavar="ACTION")
    add = csub.add_parser("add", help="add a job")
    add.add_argument("--name", required=True, help="a name for the job")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="5-field crontab, e.g. '0 9 * * 1-5'")
    when.add_argument("--every", metavar="DUR", help="interval, e.g. 30m, 2h, 1d")
    when.add_argument("--at", metavar="WHEN", help="one shot: RFC 3339 time or e.g. 20m")
    add.add_argument("--tz", help="IANA zone of --cron (default: the agent's user_timezone)")
    add.add_argument("--message", required=True, help="what the job tells the agent")
    add.add_argument("--session", choices=["main", "isolated"], default="main",
                     help="main: system event in the main session + heartbeat wake; "
                          "isolated: its own turn in agent:<agent>:cron:<id>")
    add.add_argument("--agent", help="agent that runs the job (default: the first agent)")
    _target_flags(add, "where an isolated job's reply goes (default: nowhere: the CLI has "
                       "no chat)")
    add.add_argument("--timeout", metavar="DUR", help="run timeout (default 10m / 60m)")
    add.add_argument("--keep", action="store_true",
                     help="keep an --at job (disabled) after it ran instead of deleting it")
    add.add_argument("--json", action="store_true")
    _add_edit(csub)
    ls = csub.add_parser("list", help="list jobs")
    ls.add_argument("--json", action="store_true")
    for name, text in (("run", "run a job now (needs the gateway)"), ("enable", "enable a job"),
                       ("disable", "disable a job"), ("rm", "remove a job")):
        one = csub.add_parser(name, help=text)
        one.add_argument("id", metavar="ID", help="the job id (`tidegate cron list`)")
        one.add_argument("--json", action="store_true")
    runs = csub.add_parser("runs", help="a job's run log")
    runs.add_argument("id", metavar="ID", help="the job id (`tidegate cron list`)")
    runs.add_argument("--limit", type=int, default=20, help="newest N runs (default 20)")
    runs.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cron)


def _add_edit(csub: Any) -> None:
    """``cron edit ID``: every field of ``cron add`` becomes optional."""
    ed = csub.add_parser("edit", help="change a job (the running gateway applies it at once)")
    ed.add_argument("id", metavar="ID", help="the job id (`tidegate cron list`)")
    ed.add_argument("--name", help="a new name")
    new_when = ed.add_mutually_exclusive_group()
    new_when.add_argument("--schedule", "--cron", dest="cron", metavar="EXPR",
                          help="new 5-field crontab")
    new_when.add_argument("--every", metavar="DUR", help="new interval")
    new_when.add_argument("--at", metavar="WHEN", help="new one-shot time")
    ed.add_argument("--tz", help="IANA zone of the (new or current) crontab schedule")
    ed.add_argument("--message", help="new text the job tells the agent")
    ed.add_argument("--session", choices=["main", "isolated"],
                    help="main: system event + heartbeat wake; isolated: its own turn")
    _target_flags(ed, "a new delivery target")
    ed.add_argument("--timeout", metavar="DUR", help="new run timeout, e.g. 10m")
    ed.add_argument("--json", action="store_true")


def _target_flags(p: Any, text: str) -> None:
    """``--to <channel>:<to>[:<thread>]`` and its older spelling ``--deliver``, which also
    takes ``none`` (``last`` is refused: it reached whichever chat spoke most recently)."""
    to = p.add_mutually_exclusive_group()
    to.add_argument("--to", dest="deliver", metavar="TARGET",
                    help=f"{text}: <channel>:<to>[:<thread>], e.g. telegram:123456789")
    to.add_argument("--deliver", dest="deliver", metavar="TARGET",
                    help="none | <channel>:<to>[:<thread>] (same as --to)")


def cmd_cron(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    try:
        return _CRON[args.cron_cmd](args, loaded)
    except CliError as exc:
        print(str(exc), file=sys.stderr)
        return exc.code


_CRON: dict[str, Callable[[argparse.Namespace, LoadedConfig], int]] = {
    "add": cron_add, "edit": cron_edit, "list": cron_list, "run": cron_run, "enable": cron_toggle,
    "disable": cron_toggle, "rm": cron_rm, "runs": cron_runs,
}
