"""Who may talk to the bot, in ``tidegate setup``: the DM policy (``--dm-policy``, or the
wizard's question) and the allowlist (``--allow-from CHANNEL:ID``, repeatable, or asked
per platform when its policy is ``allowlist``) of the platforms set up in this run.

The answer applies to every platform set up, except one whose own default is stricter:
a platform never gets a looser policy than its plugin's default from the one answer for
all (email keeps ``allowlist``: a pairing code mailed to any sender would answer spam);
the wizard says so, and ``channels.<name>.dm_policy`` in ``config.yaml`` changes it.
Errors are :class:`SetupError` with exit 2 (bad input)."""

from __future__ import annotations

import re
from typing import Any

from gateway.cli.setup.answers import SetupError

POLICIES = ["pairing", "allowlist", "open"]
STRICTNESS = {"open": 0, "pairing": 1, "allowlist": 2, "disabled": 3}
KEPT = ("{name}: dm_policy stays {default} (its default; {answer} is looser) — change "
        "channels.{name}.dm_policy in config.yaml to override it")
NOBODY = ("{name}: dm_policy allowlist with no allow_from: nobody gets an answer until "
          "you add senders (--allow-from {name}:ID, or channels.{name}.allow_from)")


def parse_allow_from(values: list[str] | None) -> dict[str, list[str]]:
    """``["telegram:123", "email:@example.org"]`` -> ``{channel: [ids]}`` (split at the
    first colon: a Matrix id ``@a:example.org`` keeps its own). Raises SetupError for an
    entry without a channel or an id, a channel no installed plugin has, or an id that
    channel's config model refuses (an email entry that is no address or @domain)."""
    from channels.registry import channel_names
    known = channel_names()
    out: dict[str, list[str]] = {}
    for value in values or ():
        channel, _, sender = value.partition(":")
        channel, sender = channel.strip().lower(), sender.strip()
        if not channel or not sender:
            raise SetupError(f"--allow-from {value}: expected CHANNEL:ID, e.g. "
                             "telegram:123456789 or email:alice@example.org", 2)
        if channel not in known:
            raise SetupError(f"--allow-from {value}: no channel {channel!r} (installed: "
                             f"{', '.join(known)})", 2)
        problem = _senders_problem(channel, [sender])
        if problem:
            raise SetupError(f"--allow-from {value}: {problem}", 2)
        if sender not in out.setdefault(channel, []):
            out[channel].append(sender)
    return out


def plugin_default(name: str) -> str:
    """The ``dm_policy`` default of platform ``name``'s config model (``pairing`` when it
    does not say)."""
    from channels.registry import config_model
    field = getattr(config_model(name), "model_fields", {}).get("dm_policy")
    default = getattr(field, "default", None)
    return default if default in STRICTNESS else "pairing"


def apply_access(ans: Any, channels: dict[str, dict[str, Any]]) -> None:
    """Write ``dm_policy`` and ``allow_from`` into each section of ``channels`` (the
    platforms set up in this run), printing a line for each platform that keeps its
    stricter default or ends up answering nobody. Raises SetupError for an
    ``--allow-from`` naming a platform not set up in this run."""
    allowed = parse_allow_from(getattr(ans.args, "allow_from", None))
    for name in allowed:
        if name not in channels:
            raise SetupError(f"--allow-from {name}:...: {name} is not set up in this run "
                             f"(set up: {', '.join(channels)})", 2)
    answer = ans.ask("Who may DM the bot", "dm_policy", "pairing", POLICIES)
    for name, section in channels.items():
        default = plugin_default(name)
        policy = answer
        if STRICTNESS[answer] < STRICTNESS[default]:
            policy = default
            print(KEPT.format(name=name, default=default, answer=answer))
        section["dm_policy"] = policy
        senders = allowed.get(name) or _ask_senders(ans, name, policy)
        if senders:
            section["allow_from"] = senders
        elif policy == "allowlist":
            print(NOBODY.format(name=name))


def _ask_senders(ans: Any, name: str, policy: str) -> list[str]:
    """The wizard asks for the allowlist of a platform whose policy is ``allowlist``."""
    if not ans.interactive or policy != "allowlist":
        return []
    while True:
        text = ans.ask(f"{name}: who may DM the bot (allow_from ids, separated by commas)",
                       "_none", "")
        senders = [s for s in re.split(r"[,\s]+", text) if s]
        problem = _senders_problem(name, senders) if senders else None
        if problem is None:
            return senders
        print(f"  {problem}")


def _senders_problem(name: str, senders: list[str]) -> str | None:
    """What platform ``name``'s config model says against ``allow_from: senders``."""
    from channels.registry import config_model
    from gateway.cli.setup.channels import key_problem
    model = config_model(name)
    return key_problem(model, "allow_from", senders) if model is not None else None
