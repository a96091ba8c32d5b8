"""The chat-platform part of ``tidegate setup``, driven by the installed channel plugins.

Each plugin's ``setup`` questions (``channels.sdk.SetupField``) become prompts and the
flags ``--<name>-<key> VALUE`` / ``--<name>-<key>-env NAME`` (a secret is never a flag,
only the name of the environment variable holding it); the answers are validated with the
plugin's config model and checked live with its ``probe`` (a wrong token or password is
asked again, or stops a non-interactive run with exit 1 and the platform's reason). A
plugin without questions is named with a note to configure it in ``config.yaml``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from gateway.cli.setup.answers import SetupError

NO_QUESTIONS = ("{name}: its plugin asks no setup questions; configure channels.{name} in "
                "config.yaml as its documentation says")


def dest(name: str, field: Any) -> str:
    return f"ch_{name}_{field.key}"


def flag(name: str, field: Any) -> str:
    return f"--{name}-{field.key.replace('_', '-')}" + ("-env" if field.secret else "")


def add_flags(parser: argparse.ArgumentParser, builtin_only: bool = False) -> None:
    """The flags of every installed channel plugin's setup questions (loading the plugins:
    only when the command is ``setup``)."""
    from channels.registry import channel_plugins
    for name, plugin in channel_plugins(builtin_only).items():
        for f in plugin.setup:
            text = (f"environment variable holding the {f.prompt}" if f.secret
                    else f"{f.prompt}" + (f" (default {f.default})" if f.default else ""))
            parser.add_argument(flag(name, f), dest=dest(name, f),
                                metavar="NAME" if f.secret else (None if f.choices else "VALUE"),
                                choices=list(f.choices) or None,
                                help=argparse.SUPPRESS if f.advanced else text)


def collect(ans: Any, env: dict[str, str]) -> dict[str, Any]:
    """``{name: section}`` of the platforms to connect: those named by a flag, or (asked)
    the ones the user says yes to. ``env`` receives the secrets. Raises SetupError."""
    from channels.registry import channel_plugins
    out: dict[str, Any] = {}
    for name, plugin in channel_plugins().items():
        given = any(getattr(ans.args, dest(name, f), None) for f in plugin.setup
                    if not f.advanced)  # a base URL alone does not ask to connect
        if not plugin.setup:
            if ans.interactive:
                print(NO_QUESTIONS.format(name=name))
            continue
        if not given and (not ans.interactive or ans.ask(
                f"Connect {name}?", "_none", "no", ["yes", "no"]) != "yes"):
            continue
        out[name] = _section(ans, env, name, plugin)
    return out


def _section(ans: Any, env: dict[str, str], name: str, plugin: Any) -> dict[str, Any]:
    previous: dict[str, str] = {}
    while True:
        answers, names = _answers(ans, name, plugin, previous, env)
        problem, account = _check(name, plugin, answers)
        if problem is None:
            break
        if not ans.interactive:
            raise SetupError(f"the {name} settings did not work: {problem}")
        print(f"  that did not work: {problem}")
        previous = answers
    section: dict[str, Any] = {"enabled": True}
    for key, value in answers.items():
        if key in names:
            env[names[key]] = value
            section[key] = f"${{{names[key]}}}"
        else:  # as the model read it: a port is written as a number
            typed = getattr(account, key, value)
            section[key] = typed if isinstance(typed, int | float) else value
    return section


def _answers(ans: Any, name: str, plugin: Any, previous: dict[str, str],
             env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(answers by key, env var name by secret key); empty answers are left out."""
    answers: dict[str, str] = {}
    names: dict[str, str] = {}
    for f in plugin.setup:
        d = dest(name, f)
        if (f.advanced and not getattr(ans.args, d, None)) or (f.unless and
                                                               answers.get(f.unless)):
            continue
        if f.secret:
            if f.optional and not getattr(ans.args, d, None) and not ans.interactive:
                continue
            var, value = ans.secret(f.prompt, d, f.env_name(name), env, optional=f.optional,
                                    label=flag(name, f))
            if value:
                answers[f.key], names[f.key] = value, var
            continue
        while True:
            value = ans.ask(f.prompt, d, previous.get(f.key, f.default),
                            list(f.choices) or None, label=flag(name, f),
                            blank="leave it unset" if f.optional else None).strip()
            problem = "an answer is required" if not (value or f.optional) else \
                key_problem(plugin.config, f.key, value) if value else None
            if problem is None:
                break
            if not ans.interactive:
                raise SetupError(f"{flag(name, f)} {value}: {problem}" if value else
                                 f"{flag(name, f)} VALUE is required", 2)
            print(f"  {problem}")
        if value:
            answers[f.key] = value
    return answers, names


def key_problem(model: Any, key: str, value: Any) -> str | None:
    """What the config ``model`` says against ``key: value`` on its own (a port out of
    range, an allow_from entry that is not an address), or None."""
    from pydantic import ValidationError
    try:
        model.model_validate({key: value})
    except ValidationError as exc:
        found = [str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()
                 if e["loc"][:1] == (key,)]
        return "; ".join(found) or None
    except Exception:  # noqa: BLE001 - a broken model is reported by _check / doctor
        return None
    return None


def _check(name: str, plugin: Any, answers: dict[str, str]) -> tuple[str | None, Any]:
    """``(None, account config)`` when the answers validate and the plugin's probe
    accepts them (or it has none); else ``(what is wrong, None)``: the config model's
    errors, or the probe's detail."""
    from pydantic import ValidationError

    from channels.probing import check_account
    from channels.sections import account_configs
    try:
        section = plugin.config.model_validate({"enabled": True, **answers})
    except ValidationError as exc:
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or name}: "
                         f"{str(e['msg']).removeprefix('Value error, ')}".replace("\n", "; ")
                         for e in exc.errors()), None
    account = account_configs(section)["default"]
    ok, detail = asyncio.run(check_account(plugin, account))
    if ok is False:
        return detail, None
    print(f"ok: {name} {detail}" if ok else f"  {name}: {detail}")
    return None, account
