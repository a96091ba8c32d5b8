"""``tidegate gateway``: run the daemon in the foreground until SIGTERM/SIGINT.

Signals: SIGTERM/SIGINT stop gracefully (exit 0); SIGHUP reloads the config (a config that
fails validation is reported and the running one kept). systemd: READY=1 once serving,
STOPPING=1 on shutdown, WATCHDOG=1 every half ``$WATCHDOG_USEC`` while the loop is healthy.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import structlog

from gateway.config.load import ConfigError, LoadedConfig, load_config
from gateway.logs.pipeline import close_logging, configure_logging, update_secrets
from gateway.logs.redact import find_secrets
from gateway.server.http import PortInUse
from gateway.service import cold_start
from gateway.service.daemon import Gateway
from gateway.service.gc_policy import apply_gc_policy
from gateway.service.notify import SystemdNotifier, watchdog_loop
from gateway.service.state_dir import GatewayLocked

log = structlog.get_logger(__name__)


def run_gateway(config_path: str | None, *, port: int | None = None,
                bind: str | None = None) -> int:
    """Run until stopped; returns the exit code (2: invalid config). ``port``/``bind``
    (``tidegate gateway --port/--bind``) override ``gateway.port``/``gateway.bind`` and are
    validated the same way."""
    overrides = {k: v for k, v in (("port", port), ("bind", bind)) if v is not None}
    try:
        loaded = _load(config_path, overrides)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    cfg = loaded.config
    os.umask(0o077)  # sessions, transcripts and the timeline are private conversations
    configure_logging(state_dir=loaded.state_dir, level=cfg.logging.level,
                      fmt=cfg.logging.format, secrets=find_secrets(loaded.raw),
                      max_bytes=cfg.logging.max_bytes, backups=cfg.logging.backups)
    try:
        return asyncio.run(_main(loaded, config_path, overrides))
    except KeyboardInterrupt:
        return 0
    finally:
        close_logging()


def _load(config_path: str | None, overrides: dict) -> LoadedConfig:
    """load_config with command-line overrides of the ``gateway`` section (validated like
    the file: a non-loopback --bind is refused). Raises ConfigError."""
    loaded = load_config(config_path)
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


async def _main(loaded: LoadedConfig, config_path: str | None, overrides: dict) -> int:
    loop = asyncio.get_running_loop()
    notifier = SystemdNotifier.from_env()
    gw = Gateway(loaded, notifier=notifier)
    stop = asyncio.Event()

    def on_stop(signame: str) -> None:
        log.info("signal_received", signal=signame)
        stop.set()

    async def on_reload() -> None:
        try:
            new = _load(config_path, overrides)
        except ConfigError as exc:
            log.error("config_reload_failed", problems=exc.problems)
            return
        update_secrets(find_secrets(new.raw))
        notifier.notify("RELOADING=1")
        try:
            pending = await gw.reload(new)
            if pending:
                log.warning("config_reload_needs_restart", settings=pending)
        finally:
            notifier.notify("READY=1")

    loop.add_signal_handler(signal.SIGTERM, on_stop, "SIGTERM")
    loop.add_signal_handler(signal.SIGINT, on_stop, "SIGINT")
    loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(on_reload()))
    from runtime.storage.postgres.errors import StorageStartError
    try:
        await gw.start()
    except (GatewayLocked, StorageStartError) as exc:
        log.error("gateway_start_failed", error=str(exc))
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except PortInUse as exc:
        log.error("gateway_start_failed", error=str(exc))
        print(f"error: {exc}", file=sys.stderr)
        await gw.stop()
        return 1
    log.info("gc_policy", **apply_gc_policy())
    cold_start.finish()  # after the freeze: the collector never walks start-up objects
    watchdog = loop.create_task(watchdog_loop(notifier, gw.clock, stop,
                                              healthy=lambda: not gw.stopping))
    await stop.wait()
    await gw.stop()
    watchdog.cancel()
    return 0
