"""``tidegate gateway``: run the daemon in the foreground until SIGTERM/SIGINT.

Signals: SIGTERM/SIGINT stop gracefully (exit 0); SIGHUP reloads the config and re-reads the
env file (a config that fails validation is reported — log, ``status`` problems,
``/readyz`` — and the running one kept; a changed secret applies live, except where the
setting it feeds needs a restart, which the reload then reports). systemd: READY=1 once serving,
STOPPING=1 on shutdown, WATCHDOG=1 every half ``$WATCHDOG_USEC`` while the loop is healthy.
Once serving it prints one human line on stdout (``ready_line``); logs go to stderr.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import structlog

from gateway.config.env_file import EnvFileChoice, ProcessEnv
from gateway.config.load import ConfigError, LoadedConfig, load_config
from gateway.logs.pipeline import close_logging, configure_logging, update_secrets
from gateway.logs.redact import config_secrets, find_secrets
from gateway.server.http import PortInUse
from gateway.service import cold_start
from gateway.service import exit as exit_
from gateway.service.daemon import Gateway
from gateway.service.gc_policy import apply_gc_policy
from gateway.service.notify import SystemdNotifier, watchdog_loop
from gateway.service.state_dir import GatewayLocked
from runtime import plugins

log = structlog.get_logger(__name__)


def run_gateway(config_path: str | None, *, port: int | None = None,
                bind: str | None = None, env_file: EnvFileChoice | None = None) -> int:
    """Run until stopped; returns the exit code (2: invalid config or env file).
    ``port``/``bind`` (``tidegate gateway --port/--bind``) override
    ``gateway.port``/``gateway.bind`` and are validated the same way. ``env_file``: which
    env file to read (default ``<state_dir>/tidegate.env``; the environment wins)."""
    overrides = {k: v for k, v in (("port", port), ("bind", bind)) if v is not None}
    source = _Source(config_path, overrides, env_file or EnvFileChoice(),
                     ProcessEnv(os.environ))
    held: list = []  # plugins that failed to load: logged once the log is set up
    try:
        with plugins.reported_by(held.append):
            loaded = source.load(start=True)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        for info in held:
            print(f"tidegate: {info.error} (`tidegate plugins doctor` shows why)",
                  file=sys.stderr)
        return 2
    source.env.apply(loaded.env_file)
    cfg = loaded.config
    os.umask(0o077)  # sessions, transcripts and the timeline are private conversations
    configure_logging(state_dir=loaded.state_dir, level=cfg.logging.level,
                      fmt=cfg.logging.format, secrets=_secrets(loaded),
                      max_bytes=cfg.logging.max_bytes, backups=cfg.logging.backups)
    plugins.log_failures()
    try:
        # bounded: a channel that ignores cancellation must not keep the process alive
        return exit_.run(_main(loaded, source), before_exit=close_logging)
    except KeyboardInterrupt:
        return 0
    finally:
        close_logging()


def ready_line(loaded: LoadedConfig, port: int | None, config_path: str | None) -> str:
    """The one human line a started gateway prints on stdout (the journal keeps it under
    systemd): ``tidegate ready: http://127.0.0.1:PORT (model PROVIDER/MODEL) — open the
    dashboard: tidegate [--config PATH] dashboard``; without webchat the last part names
    ``tidegate status`` instead. The model is the default agent's primary model."""
    cfg = loaded.config
    host = cfg.gateway.bind
    host = f"[{host}]" if ":" in host else host
    model = cfg.agent(cfg.default_agent()).model_primary or "none configured"
    cli = "tidegate" if config_path is None else \
        f"tidegate --config {Path(config_path).absolute()}"
    then = f"open the dashboard: {cli} dashboard" if cfg.channels.webchat.enabled else \
        f"check it: {cli} status"
    return f"tidegate ready: http://{host}:{port} (model {model}) — {then}"


class _Source:
    """Where this process's config comes from: the file, the command-line overrides and
    the env file over the explicit environment (read again on every reload)."""

    def __init__(self, config_path: str | None, overrides: dict, choice: EnvFileChoice,
                 env: ProcessEnv) -> None:
        self.config_path, self.overrides, self.choice, self.env = (config_path, overrides,
                                                                   choice, env)

    def load(self, *, start: bool = False) -> LoadedConfig:
        """``start``: an invalid file may be replaced by the last-known-good config
        (``config.on_invalid: lkg``, gateway/config/lkg.py); a reload never does that
        (it keeps the running config). Raises ConfigError."""
        def load(path: str | None) -> LoadedConfig:
            return load_for_start(path, self.overrides, env=self.env.explicit,
                                  env_file=self.choice)
        if not start:
            return load(self.config_path)
        from gateway.config.lkg import load_or_lkg
        return load_or_lkg(self.config_path, self.env.explicit, load)


def _secrets(loaded: LoadedConfig) -> list[str]:
    """What the log redacts: the config's secrets and the env file's secret-named values."""
    return config_secrets(loaded) + find_secrets(loaded.env_file.values)


def load_for_start(config_path: str | None, overrides: dict, *,
                   env: dict[str, str] | None = None,
                   env_file: EnvFileChoice | None = None) -> LoadedConfig:
    """What ``tidegate gateway`` loads at start: load_config (strict ``${VAR}``, the env
    file over ``env``) with command-line overrides of the ``gateway`` section (validated
    like the file: a non-loopback --bind is refused). ``gateway restart`` checks the same
    before it stops anything. Raises ConfigError."""
    loaded = load_config(config_path, env=env, env_file=env_file)
    if overrides:
        from pydantic import ValidationError

        from gateway.config.schema import GatewaySection
        from runtime.config_types import format_validation_error
        merged = {**loaded.config.gateway.model_dump(), **overrides}
        try:
            loaded.config.gateway = GatewaySection.model_validate(merged)
        except ValidationError as exc:
            raise ConfigError("command line", [f"--{p}" for p in
                                               format_validation_error(exc)]) from None
    return loaded


async def _main(loaded: LoadedConfig, source: _Source) -> int:
    loop = asyncio.get_running_loop()
    notifier = SystemdNotifier.from_env()
    gw = Gateway(loaded, notifier=notifier)
    stop = asyncio.Event()

    def on_stop(signame: str) -> None:
        log.info("signal_received", signal=signame)
        stop.set()
        gw.start_abort.set()  # a start still waiting for PostgreSQL gives up

    loop.add_signal_handler(signal.SIGTERM, on_stop, "SIGTERM")
    loop.add_signal_handler(signal.SIGINT, on_stop, "SIGINT")
    loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(
        reload_config(gw, source, notifier)))
    from runtime.storage.postgres.errors import StartAborted, StorageStartError
    try:
        await gw.start()
    except StartAborted as exc:  # told to stop before it could serve
        log.info("gateway_start_aborted", reason=str(exc))
        return 0
    except (GatewayLocked, StorageStartError) as exc:
        log.error("gateway_start_failed", error=str(exc))
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except PortInUse as exc:
        log.error("gateway_start_failed", error=str(exc))
        print(f"error: {exc}", file=sys.stderr)
        await gw.stop()
        return 1
    print(ready_line(loaded, gw.port, source.config_path), flush=True)
    log.info("gc_policy", **apply_gc_policy())
    cold_start.finish()  # after the freeze: the collector never walks start-up objects
    watchdog = loop.create_task(watchdog_loop(notifier, gw.clock, stop,
                                              healthy=lambda: not gw.stopping))
    await stop.wait()
    await gw.stop()
    watchdog.cancel()
    return 0


async def reload_config(gw: Gateway, source: _Source, notifier: SystemdNotifier) -> None:
    """SIGHUP: load the config and the env file again and apply them. A config that
    fails is logged and recorded in ``gw.reload_report`` (status problems, ``/readyz``);
    the running one stays. Env-file variables whose value changed are named (never
    shown) in ``config_reloaded``; settings only a restart applies in
    ``config_reload_needs_restart`` and status problems."""
    at = gw.clock.time()
    try:
        new = source.load()
    except ConfigError as exc:
        log.error("config_reload_failed", problems=exc.problems)
        gw.reload_report.failed(at, exc.problems)
        return
    env_changed = source.env.apply(new.env_file)
    update_secrets(_secrets(new))
    notifier.notify("RELOADING=1")
    try:
        pending = await gw.reload(new, env_changed=env_changed)
        gw.reload_report.succeeded(at, pending, env_changed)
        if pending:
            log.warning("config_reload_needs_restart", settings=pending,
                        env_changed=env_changed, fix="tidegate gateway restart")
    finally:
        notifier.notify("READY=1")
