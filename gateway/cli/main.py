"""The ``tidegate`` command line.

Every command reads the config from ``--config PATH`` or ``$TIDEGATE_CONFIG`` (then
``~/.tidegate/config.yaml``, then built-in defaults) and the env file
``<state_dir>/tidegate.env`` (``--env-file PATH`` another, ``--no-env-file`` none; the
process environment wins over it: gateway/config/env_file.py). Commands that act on a running gateway
talk to its loopback control API; exit codes: 0 ok, 1 failure, 2 bad config or usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from gateway.cli.commands import (
    BUILT_IN_GROUPS,
    FAST_GROUPS,
    cmd_config_validate,
    gateway_section,
)
from gateway.cli.fast_start import (
    FAST_COMMANDS,
    LOOPBACK_ONLY,
    VersionAction,
    command_word,
    without_tls,
)
from gateway.cli.output import stdout_gone
from gateway.cli.parser_tree import config_flag_everywhere, user_facing_names
from gateway.config.env_file import EnvFileChoice
from gateway.config.load import ConfigError, LoadedConfig, load_config

Command = Callable[[argparse.Namespace, LoadedConfig], int]

# What every command's exit code means (the CLI reference prints this table).
EXIT_CODES = {
    0: "success",
    1: "the command failed: the gateway is not running or answered with an error, a check "
       "found a problem, a named thing does not exist",
    2: "bad usage or an invalid config (the problems are printed, each with its key)",
}


DESCRIPTION = ("tidegate — an always-on AI agent gateway: your agents in the chat platforms "
               "of the installed channel plugins (tidegate plugins list), a local webchat "
               "and the terminal.")


def build_parser(extensions: bool = True, command: str | None = None,
                 setup_flags: bool | str = False) -> argparse.ArgumentParser:
    """The whole CLI. ``extensions=False`` leaves out the command groups of their own
    modules (importing them all costs ~0.4 s): for ``agent``/``chat``/``gateway`` (see
    main). ``command`` (one of those) builds only the group that defines it: the rest of
    the tree is ~15 ms of argparse at every start of the daemon and the chat clients.
    ``setup_flags``: add the channel plugins' ``setup`` flags (loading every plugin, so
    only for ``tidegate setup``; ``"builtin"``: the built-in plugins' only, the docs)."""
    p = argparse.ArgumentParser(prog="tidegate", description=DESCRIPTION)
    p.add_argument("--config", help="config file (default: $TIDEGATE_CONFIG, then "
                   "~/.tidegate/config.yaml, then built-in defaults)")
    p.add_argument("--version", action=VersionAction, nargs=0,
                   help="print the version and exit")
    p.add_argument("--env-file", metavar="PATH",
                   help="read ${VARS} from this systemd EnvironmentFile (default: "
                        "<state_dir>/tidegate.env when it exists; the environment wins)")
    p.add_argument("--no-env-file", action="store_true",
                   help="read no env file: only the process environment")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_group in FAST_GROUPS.get(command, BUILT_IN_GROUPS):
        add_group(sub)
    for register in _extensions() if extensions and command is None else ():
        register(sub)
    if setup_flags and extensions and command is None and "setup" in sub.choices:
        from gateway.cli.setup.channels import add_flags  # loads the channel plugins
        add_flags(sub.choices["setup"], builtin_only=setup_flags == "builtin")
    config_flag_everywhere(p)
    user_facing_names(p)
    p.set_defaults(root_parser=p)  # `completion` walks the whole tree
    return p


def _extensions() -> list[Callable[[Any], None]]:
    """Subcommand groups that live in their own modules."""
    import importlib
    out = []
    for module in ("gateway.cli.pairing", "gateway.cli.cron", "gateway.cli.scheduler", "gateway.cli.timeline",
                   "gateway.cli.mcp", "gateway.cli.models", "gateway.cli.usage",
                   "gateway.cli.channels", "gateway.cli.completion", "gateway.cli.doctor",
                   "gateway.cli.setup", "gateway.cli.tools", "gateway.cli.skills",
                   "gateway.cli.subagents", "gateway.cli.storage", "gateway.cli.approvals",
                   "gateway.cli.memory", "gateway.cli.backup", "gateway.cli.plugins"):
        try:
            out.append(importlib.import_module(module).register)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    return out


def env_choice(args: argparse.Namespace) -> EnvFileChoice:
    """The env file the command line asks for (``--env-file``, ``--no-env-file``)."""
    from pathlib import Path
    if getattr(args, "no_env_file", False):
        return EnvFileChoice(enabled=False)
    path = getattr(args, "env_file", None)
    return EnvFileChoice(path=Path(path).expanduser() if path else None)


def main(argv: list[str] | None = None) -> int:
    own_process = argv is None  # the tidegate script or python -m gateway.cli
    argv = sys.argv[1:] if argv is None else argv
    word = command_word(argv)
    fast = word in FAST_COMMANDS
    if own_process and word in LOOPBACK_ONLY:
        without_tls()
    if fast:  # the gateway itself logs a broken plugin (plugin_load_failed, traceback)
        return _parse_and_run(argv, word, fast)
    from gateway.cli.output import plugin_failure_line
    from runtime.plugins import reported_by
    with reported_by(plugin_failure_line(word)):
        return _parse_and_run(argv, word, fast)


def _parse_and_run(argv: list[str], word: str | None, fast: bool) -> int:
    parser = build_parser(extensions=not fast, command=word if fast else None,
                          setup_flags=word == "setup")
    if word is None:  # argparse would only say "COMMAND is required" for `tidegate --bogus`
        _, unknown = parser.parse_known_args([*argv, "status"])
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except BrokenPipeError:  # `tidegate ... | head` stopped reading: done
        return stdout_gone()


def _dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command with the config it needs (exit 2 on a config error). The env
    file rule is applied here, once: ``args.env_choice`` is what a command that loads the
    config itself (``raw_config``: gateway, doctor) passes on."""
    args.env_choice = env_choice(args)
    if getattr(args, "raw_config", False):
        return args.func(args, None)
    if getattr(args, "gateway_only", False):  # talks to the gateway only: stay fast
        try:
            loaded = gateway_section(args)
        except ConfigError as exc:
            print(exc.render(), file=sys.stderr)
            return 2
        return args.func(args, loaded)
    try:
        # Only `config validate` insists on every ${VAR}: other commands do not need all
        # the secrets (a variable set nowhere stays as written).
        loaded = load_config(args.config, strict_env=args.func is cmd_config_validate,
                             env_file=args.env_choice)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    from gateway.cli.output import run_redacted
    from gateway.logs.redact import config_secrets
    return run_redacted(lambda: args.func(args, loaded), config_secrets(loaded))


if __name__ == "__main__":
    sys.exit(main())
