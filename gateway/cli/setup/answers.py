"""Where the answers of ``tidegate setup`` come from: flags (``--non-interactive``) or a
prompt; secrets hidden (getpass) or named by an environment variable. Errors are
:class:`SetupError` (exit ``code``: 2 bad input, 1 a check failed)."""

from __future__ import annotations

import argparse
import getpass
import os


class SetupError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Answers:
    """Where each answer comes from: flags (``--non-interactive``) or a prompt."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.interactive = not args.non_interactive

    def ask(self, prompt: str, flag: str, default: str = "",
            choices: list[str] | None = None, label: str | None = None,
            blank: str | None = "leave it empty") -> str:
        """An answer: ``--<flag>`` (``label`` names the flag in errors), else prompted.
        The prompt shows the default in parentheses; without one, what Enter does
        (``(Enter: <blank>)``), or ``(required)`` when ``blank`` is None."""
        given = getattr(self.args, flag, None)
        if given or not self.interactive:
            value = given or default
            if choices and value not in choices:
                raise SetupError(f"{label or _label(flag)}: one of {', '.join(choices)}", 2)
            return value
        hint = f" [{'/'.join(choices)}]" if choices else ""
        enter = default or ("required" if blank is None else f"Enter: {blank}")
        while True:
            value = input(f"{prompt}{hint} ({enter}): ").strip() or default
            if not choices or value in choices:
                return value
            print(f"  choose one of {', '.join(choices)}")

    def secret(self, prompt: str, flag: str, default_name: str, env: dict[str, str],
               optional: bool = False, label: str | None = None) -> tuple[str, str]:
        """(env var name, value) of a secret: from ``--<flag>`` NAME, else prompted
        (``optional``: an empty answer gives an empty value)."""
        name = getattr(self.args, flag, None)
        if name:
            value = os.environ.get(name)
            if not value:
                raise SetupError(f"{label or _label(flag)}: environment variable {name} "
                                 "is not set", 2)
            return name, value
        if not self.interactive:
            raise SetupError(f"{label or _label(flag)} NAME is required", 2)
        value = getpass.getpass(f"{prompt} (hidden): ").strip()
        if not value and not optional:
            raise SetupError(f"{prompt}: nothing entered", 2)
        return default_name, value


def _label(flag: str) -> str:
    return "--" + flag.replace("_", "-")
