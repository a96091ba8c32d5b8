"""Walks over the finished ``tidegate`` argparse tree: ``--config`` accepted after every
subcommand (and the env-file flags), and missing-subcommand errors and ``--json`` help in user-facing words."""

from __future__ import annotations

import argparse


def user_facing_names(parser: argparse.ArgumentParser) -> None:
    """A missing subcommand is reported by its choices (``required: {list,show}``), never
    by the internal ``dest`` (``sessions_cmd``); every ``--json`` flag says what it does."""
    for action in parser._actions:
        if "--json" in action.option_strings and not action.help:
            action.help = "machine-readable JSON output"
        if isinstance(action, argparse._SubParsersAction):
            if action.metavar is None or "_" in str(action.metavar):
                action.metavar = "{" + ",".join(action.choices) + "}"
            for child in set(action.choices.values()):
                user_facing_names(child)


def config_flag_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept ``--config``, ``--env-file`` and ``--no-env-file`` after any subcommand too
    (``tidegate gateway --config X``, ``tidegate config validate --env-file F``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                for flag, kwargs in (("--config", {}), ("--env-file", {"metavar": "PATH"}),
                                     ("--no-env-file", {"action": "store_true"})):
                    if flag not in child._option_string_actions:
                        child.add_argument(flag, default=argparse.SUPPRESS,
                                           help=argparse.SUPPRESS, **kwargs)
                config_flag_everywhere(child)
