"""``tidegate setup``: write ``config.yaml`` and a 0600 env file for a new installation.

It asks for the model provider and its key (checked with one tiny request), the
timezone, the chat platforms and their tokens (each checked live: Telegram ``getMe``,
Slack ``auth.test``, Discord ``/users/@me``) and the DM policy, and can install the
systemd unit. ``--non-interactive`` takes every answer from flags; secrets are never
flags: ``--api-key-env NAME`` / ``--telegram-token-env NAME`` ... name environment
variables holding them. Secrets go to ``<state_dir>/tidegate.env`` (mode 0600) and the
config refers to them as ``${NAME}``. Exit 0 written, 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

PROVIDERS = {"openai": ("OPENAI_API_KEY", "gpt-4o-mini"),
             "anthropic": ("ANTHROPIC_API_KEY", "claude-haiku-4-5"), "echo": ("", "")}
PLATFORMS = {"telegram": ["TELEGRAM_BOT_TOKEN"], "slack": ["SLACK_BOT_TOKEN",
                                                            "SLACK_APP_TOKEN"],
             "discord": ["DISCORD_BOT_TOKEN"]}


class SetupError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def register(sub: Any) -> None:
    s = sub.add_parser("setup", help="write config.yaml and a 0600 env file (a wizard)")
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
                   help="who may DM the bot (default pairing)")
    for platform, names in PLATFORMS.items():
        for name in names:
            flag = {"TELEGRAM_BOT_TOKEN": "telegram", "DISCORD_BOT_TOKEN": "discord"}.get(
                name, name.lower().removesuffix("_token").replace("_", "-"))
            s.add_argument(f"--{flag}-token-env", metavar="NAME", dest=f"{name.lower()}_env",
                           help=f"environment variable holding the {platform} "
                                f"{'app' if 'APP' in name else 'bot'} token")
        s.add_argument(f"--{platform}-api-base-url", help=argparse.SUPPRESS)
    s.add_argument("--install-service", action="store_true",
                   help="also write the systemd unit (tidegate service install)")
    s.add_argument("--user", action="store_true", help="with --install-service: a user unit")
    s.add_argument("--force", action="store_true", help="overwrite an existing config.yaml")
    s.set_defaults(func=cmd_setup, raw_config=True)


# -- answers -------------------------------------------------------------------------------

class Answers:
    """Where each answer comes from: flags (``--non-interactive``) or a prompt."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.interactive = not args.non_interactive

    def ask(self, prompt: str, flag: str, default: str = "",
            choices: list[str] | None = None) -> str:
        given = getattr(self.args, flag, None)
        if given or not self.interactive:
            value = given or default
            if choices and value not in choices:
                raise SetupError(f"--{flag.replace('_', '-')}: one of {', '.join(choices)}", 2)
            return value
        hint = f" [{'/'.join(choices)}]" if choices else ""
        while True:
            value = input(f"{prompt}{hint} ({default or 'none'}): ").strip() or default
            if not choices or value in choices:
                return value
            print(f"  choose one of {', '.join(choices)}")

    def secret(self, prompt: str, flag: str, default_name: str,
               env: dict[str, str]) -> tuple[str, str]:
        """(env var name, value) of a secret: from ``--<flag>`` NAME, else prompted."""
        name = getattr(self.args, flag, None)
        if name:
            value = os.environ.get(name)
            if not value:
                raise SetupError(f"--{flag.replace('_', '-')}: environment variable {name} "
                                 "is not set", 2)
            return name, value
        if not self.interactive:
            raise SetupError(f"--{flag.replace('_', '-')} NAME is required", 2)
        value = getpass.getpass(f"{prompt} (hidden): ").strip()
        if not value:
            raise SetupError(f"{prompt}: nothing entered", 2)
        return default_name, value


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
        base_url = ans.ask("Base URL (empty: the provider's)", "base_url", "") or None
        while True:
            name, key = ans.secret(f"{provider} API key", "api_key_env", key_name, env)
            problem = check_provider(provider, model, base_url, key)
            if problem is None:
                print(f"ok: {provider}/{model} answered")
                break
            if not ans.interactive:
                raise SetupError(f"the {provider} key did not work: {problem}")
            print(f"  that did not work: {problem}")
        env[name] = key
        cfg["models"] = {"providers": {provider: {"api": provider, "api_key": f"${{{name}}}",
                                                  **({"base_url": base_url} if base_url
                                                     else {})}}}
        cfg["agents"] = {"defaults": {"model": f"{provider}/{model}"}}
    tz = _timezone(ans)
    cfg.setdefault("agents", {}).setdefault("defaults", {})["user_timezone"] = tz
    channels = _channels(ans, env)
    if channels:
        policy = ans.ask("Who may DM the bot", "dm_policy", "pairing",
                         ["pairing", "allowlist", "open"])
        for section in channels.values():
            section["dm_policy"] = policy
        cfg["channels"] = channels
    return cfg


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


def _channels(ans: Answers, env: dict[str, str]) -> dict[str, Any]:
    from channels.config import ChannelsConfig
    from gateway.cli.channels import probe_token
    defaults = ChannelsConfig()
    out: dict[str, Any] = {}
    for platform, names in PLATFORMS.items():
        wanted = any(getattr(ans.args, f"{n.lower()}_env", None) for n in names)
        if ans.interactive and not wanted:
            wanted = ans.ask(f"Connect {platform}?", "_none", "no", ["yes", "no"]) == "yes"
        if not wanted:
            continue
        base = getattr(ans.args, f"{platform}_api_base_url", None) or \
            getattr(defaults, platform).api_base_url
        section: dict[str, Any] = {"enabled": True}
        if base != getattr(defaults, platform).api_base_url:
            section["api_base_url"] = base
        for n in names:
            while True:
                name, token = ans.secret(f"{platform} {n.lower()}", f"{n.lower()}_env", n, env)
                if "APP" in n:
                    break  # the app-level token is checked when the socket connects
                ok, detail = probe_token(platform, base, token)
                if ok:
                    print(f"ok: {platform} {detail}")
                    break
                if not ans.interactive:
                    raise SetupError(f"the {platform} token did not work: {detail}")
                print(f"  that did not work: {detail}")
            env[name] = token
            key = {"SLACK_BOT_TOKEN": "bot_token", "SLACK_APP_TOKEN": "app_token"}.get(
                n, "token")
            section[key] = f"${{{name}}}"
        out[platform] = section
    return out


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
