"""``tidegate setup``: write ``config.yaml`` and a 0600 env file for a new installation.

It asks for the model provider and its key (checked with one tiny request), the
timezone, the chat platforms — the questions each installed channel plugin contributes,
checked live with its probe (``channels.py``) — and who may talk to the bot (the DM
policy and the allowlist, ``access.py``), and can install the systemd unit. ``--non-interactive`` takes every answer from flags; secrets are never
flags: ``--api-key-env NAME`` / ``--telegram-token-env NAME`` ... name environment
variables holding them. Secrets go to ``<state_dir>/tidegate.env`` (mode 0600) and the
config refers to them as ``${NAME}``. Exit 0 written, 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gateway.cli.setup.answers import Answers, SetupError

PROVIDERS = {"openai": ("OPENAI_API_KEY", "gpt-4o-mini"),
             "anthropic": ("ANTHROPIC_API_KEY", "claude-haiku-4-5"), "echo": ("", "")}


def register(sub: Any) -> None:
    s = sub.add_parser("setup", help="write config.yaml and a 0600 env file (a wizard)",
                       epilog="Each installed chat platform adds its own flags "
                              "(--<platform>-<key> VALUE, --<platform>-<key>-env NAME for a "
                              "secret); `tidegate setup --help` lists them.")
    s.add_argument("--non-interactive", action="store_true",
                   help="take every answer from the flags below, ask nothing")
    s.add_argument("--state-dir", help="state dir (default ~/.tidegate)")
    s.add_argument("--provider", choices=list(PROVIDERS), help="model provider")
    s.add_argument("--model", help="model name (default: a small one of the provider)")
    s.add_argument("--base-url", help="provider base URL (OpenAI-compatible servers)")
    s.add_argument("--api-key-env", metavar="NAME",
                   help="environment variable that holds the provider's API key")
    s.add_argument("--timezone", help="your IANA timezone, e.g. Europe/Berlin")
    s.add_argument("--dm-policy", choices=["pairing", "allowlist", "open"],
                   help="who may DM the bot on the platforms set up (default pairing); a "
                        "platform whose own default is stricter keeps it (email: "
                        "allowlist)")
    s.add_argument("--allow-from", action="append", metavar="CHANNEL:ID",
                   help="a sender who may talk to the bot, written to "
                        "channels.<CHANNEL>.allow_from (repeatable), e.g. "
                        "telegram:123456789, email:alice@example.org, email:@example.org")
    s.add_argument("--install-service", action="store_true",
                   help="also write the systemd unit (tidegate service install)")
    s.add_argument("--user", action="store_true", help="with --install-service: a user unit")
    s.add_argument("--force", action="store_true", help="overwrite an existing config.yaml")
    s.set_defaults(func=cmd_setup, raw_config=True)


# -- checks --------------------------------------------------------------------------------

def check_provider(provider: str, model: str, base_url: str | None, key: str) -> str | None:
    """None when one tiny request (max_tokens 1) succeeds, else the error."""
    from runtime.providers.base import ChatMessage, ModelRequest, ProviderError
    from runtime.providers.registry import ProviderRegistry

    async def run() -> str | None:
        reg = ProviderRegistry({provider: {"api": provider, "base_url": base_url,
                                           "api_key": key, "headers": {}}})
        req = ModelRequest(model=model, system="Reply with OK.",
                           messages=[ChatMessage(role="user", content="ping")], max_tokens=1)
        req.timeout = 30.0
        try:
            await reg.get(provider).complete(req, None)
            return None
        except ProviderError as exc:
            return str(exc)
        finally:
            await reg.close()
    return asyncio.run(run())


def _collect(ans: Answers, env: dict[str, str]) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    provider = ans.ask("Model provider", "provider", "openai", list(PROVIDERS))
    if provider != "echo":
        key_name, model_default = PROVIDERS[provider]
        model = ans.ask("Model", "model", model_default)
        base_url = _base_url(ans)
        for attempt in range(1, KEY_TRIES + 1):
            name, key = ans.secret(f"{provider} API key", "api_key_env", key_name, env)
            problem = check_provider(provider, model, base_url, key)
            if problem is None:
                print(f"ok: {provider}/{model} answered")
                break
            if not ans.interactive or attempt == KEY_TRIES:
                raise SetupError(f"the {provider} key did not work: {problem}")
            print(f"  that did not work: {problem}")
            choice = ans.ask("Try another API key, change the base URL, or give up",
                             "_none", "key", ["key", "url", "quit"])
            if choice == "quit":
                raise SetupError(f"the {provider} key did not work: {problem}")
            if choice == "url":
                base_url = _base_url(ans, again=True)
        env[name] = key
        cfg["models"] = {"providers": {provider: {"api": provider, "api_key": f"${{{name}}}",
                                                  **({"base_url": base_url} if base_url
                                                     else {})}}}
        cfg["agents"] = {"defaults": {"model": f"{provider}/{model}"}}
    tz = _timezone(ans)
    cfg.setdefault("agents", {}).setdefault("defaults", {})["user_timezone"] = tz
    from gateway.cli.setup.channels import collect
    channels = collect(ans, env)
    if channels:
        from gateway.cli.setup.access import apply_access
        apply_access(ans, channels)
        cfg["channels"] = channels
    return cfg


KEY_TRIES = 5  # API keys tried at the prompt before the wizard gives up


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a provider's base URL (not http(s)://host...), or None."""
    from urllib.parse import urlsplit
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        return f"{url!r} is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http:// or https:// URL, e.g. https://api.example.org/v1"
    return None


def _base_url(ans: Answers, *, again: bool = False) -> str | None:
    """The base URL answer (None: the provider's own), asked until it is an http(s) URL;
    a ``--base-url`` that is not one is SetupError (exit 2). ``again``: asked after a
    failed key check (the flag is not used then)."""
    while True:
        url = ans.ask("Base URL", "_none" if again else "base_url", "",
                      blank="the provider's own").strip()
        problem = url_problem(url) if url else None
        if problem is None:
            return url or None
        if not ans.interactive or ans.args.base_url and not again:
            raise SetupError(f"--base-url: {problem}", 2)
        print(f"  {problem}")


def _check_tz(tz: str) -> None:
    """Raises SetupError (exit 2) unless ``tz`` is an IANA timezone name."""
    from zoneinfo import ZoneInfo
    try:
        ZoneInfo(tz)
    except Exception:  # noqa: BLE001 - zoneinfo raises several types
        raise SetupError(f"--timezone: unknown IANA timezone {tz!r}", 2) from None


def _timezone(ans: Answers) -> str:
    """The timezone answer; a typo at the prompt is asked again (the answers before it,
    a checked key among them, are kept). ``--timezone`` was checked before anything else."""
    while True:
        tz = ans.ask("Your timezone", "timezone", "UTC")
        try:
            _check_tz(tz)
            return tz
        except SetupError as exc:
            if not ans.interactive or ans.args.timezone:
                raise
            print(f"  {str(exc).removeprefix('--timezone: ')}, e.g. Europe/Berlin")


# -- writing -------------------------------------------------------------------------------

def _write(state: Path, config_path: Path, cfg: dict[str, Any], env: dict[str, str]) -> Path:
    from runtime.fsutil import atomic_write
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    env_path = state / "tidegate.env"
    lines = ["# tidegate secrets (written by tidegate setup). Keep this file 0600."]
    lines += [f"{k}={v}" for k, v in sorted(env.items())]
    atomic_write(env_path, ("\n".join(lines) + "\n").encode(), mode=0o600)
    cfg = {"gateway": {"state_dir": str(state)}, **cfg}
    atomic_write(config_path, yaml.safe_dump(cfg, sort_keys=False).encode(), mode=0o600)
    return env_path


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """The wizard's own lines only: the provider and platform clients' log records
    (structlog's unconfigured default prints every debug line, coloured, to stdout) are
    dropped below ERROR, and those go to stderr, away from the prompts."""
    from gateway.logs.pipeline import configure_logging, reset_logging
    configure_logging(state_dir=None, level="error", library_level="error", fmt="console")
    try:
        yield
    finally:
        reset_logging()


def cmd_setup(args: argparse.Namespace, _loaded: Any) -> int:
    state = Path(args.state_dir or "~/.tidegate").expanduser().absolute()
    config_path = Path(args.config).absolute() if args.config else state / "config.yaml"
    try:
        if config_path.exists() and not args.force:
            raise SetupError(f"{config_path} exists; --force overwrites it", 2)
        if args.timezone:  # a typo fails before any key or token is checked
            _check_tz(args.timezone)
        from gateway.cli.setup.access import parse_allow_from
        parse_allow_from(args.allow_from)  # so does a malformed --allow-from
        env: dict[str, str] = {}
        with _quiet_logs():
            cfg = _collect(Answers(args), env)
        env_path = _write(state, config_path, cfg, env)
        _validate(config_path, env)
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except (EOFError, KeyboardInterrupt):
        print("\nsetup cancelled; nothing written", file=sys.stderr)
        return 1
    print(f"wrote {config_path} and {env_path} (mode 0600)")
    if args.install_service:
        from gateway.cli.service import install
        from gateway.config.load import load_config
        return install(load_config(str(config_path), env={**os.environ, **env},
                                   strict_env=False), user_mode=args.user)
    print(f"start it: tidegate --config {config_path} gateway   (or tidegate service install)")
    return 0


def _validate(config_path: Path, env: dict[str, str]) -> None:
    from gateway.config.load import ConfigError, load_config
    try:
        load_config(str(config_path), env={**os.environ, **env})
    except ConfigError as exc:  # a bug here, never the user's answers
        raise SetupError(exc.render()) from None
