"""The last-known-good config: a config file that loaded and served for
``config.lkg_after`` seconds is kept, text as written (``${VAR}`` references, never their
values), as ``<state_dir>/config.lkg.yaml``; a start whose config fails validation runs on
that copy when ``config.on_invalid: lkg`` (default ``refuse``: exit 2, as without it).

Running on the copy is never silent: an ERROR ``config_rejected_running_lkg`` is logged and
``status`` lists the problem (the rejected file and its first error) until a reload
(SIGHUP) or restart loads the fixed file. ``on_invalid`` is read from the broken file when
its YAML can be read, else from the last-known-good copy; the state dir likewise from the
broken file's ``gateway`` section, else ``$TIDEGATE_STATE_DIR``, else the config file's own
directory when it holds a ``config.lkg.yaml``, else ``~/.tidegate``. A copy that names
another state dir than the one it lies in (the dir was moved, or restored elsewhere) is
never used: a start on it would run on that other dir.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from gateway.config.load import (
    ConfigError,
    LoadedConfig,
    load_config,
    load_gateway_section,
    parse_yaml,
    read_config_text,
    resolve_config_path,
)
from gateway.config.quick import DEFAULT_STATE_DIR
from runtime.fsutil import atomic_write

log = structlog.get_logger(__name__)
LKG_NAME = "config.lkg.yaml"


def lkg_path(state_dir: Path) -> Path:
    """``<state_dir>/config.lkg.yaml``."""
    return state_dir / LKG_NAME


def keep(loaded: LoadedConfig) -> bool:
    """Write ``loaded``'s file text as the last-known-good config (mode 0600) unless it is
    already that; True when written. Raises OSError."""
    if loaded.text is None:
        return False
    path = lkg_path(loaded.state_dir)
    try:
        if path.read_text(encoding="utf-8") == loaded.text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    atomic_write(path, loaded.text.encode("utf-8"))
    return True


def _section(data: Any, name: str, key: str, camel: str) -> Any:
    section = data.get(name) if isinstance(data, dict) else None
    return section.get(key, section.get(camel)) if isinstance(section, dict) else None


def where(config_path: str | os.PathLike | None,
          env: Mapping[str, str]) -> tuple[Path | None, Path]:
    """(the config file, the state dir) found as leniently as possible: for a broken
    file, its own ``gateway.state_dir`` when that section is valid. Raises ConfigError
    only when an explicitly named file does not exist."""
    path = resolve_config_path(config_path, env)
    try:
        return path, load_gateway_section(config_path, env, quick=False).state_dir
    except ConfigError:
        pass
    if env.get("TIDEGATE_STATE_DIR"):
        return path, Path(env["TIDEGATE_STATE_DIR"]).expanduser()
    if path is not None and lkg_path(path.parent).is_file():  # config.yaml in the state dir
        return path, path.parent
    return path, Path(DEFAULT_STATE_DIR).expanduser()


def on_invalid_mode(path: Path | None, lkg_text: str | None) -> str:
    """``config.on_invalid`` of the broken file when its YAML parses (missing: ``refuse``),
    else of the last-known-good copy."""
    text = read_config_text(path) if path else None
    for candidate in (text, lkg_text):
        if candidate is None:
            continue
        try:
            data = parse_yaml(candidate, path or "config")
        except ConfigError:
            continue
        value = _section(data, "config", "on_invalid", "onInvalid")
        return "refuse" if value is None else str(value)
    return "refuse"


def load_or_lkg(config_path: str | os.PathLike | None, env: Mapping[str, str] | None,
                load: Callable[[str | None], LoadedConfig] | None = None) -> LoadedConfig:
    """The config the gateway starts on: ``load(config_path)``, or ``load`` of its
    last-known-good copy when the file is invalid and ``on_invalid`` is ``lkg``
    (``rejected`` then says why). ``load`` defaults to :func:`load_config` with ``env``.
    Raises ConfigError (the file's problems; a note when the fallback was wanted but
    failed)."""
    env = os.environ if env is None else env
    load = load or (lambda p: load_config(p, env))
    try:
        return load(config_path)
    except ConfigError as exc:
        rejected = exc
    try:
        path, state = where(config_path, env)
        lkg = lkg_path(state)
        text = lkg.read_text(encoding="utf-8") if lkg.is_file() else None
        mode = on_invalid_mode(path, text)
    except (ConfigError, OSError, UnicodeDecodeError):
        raise rejected from None
    if mode != "lkg":
        raise rejected
    if text is None:
        note = f"config.on_invalid: lkg, but there is no last-known-good config at {lkg} yet"
        raise ConfigError(rejected.source, [*rejected.problems, note])
    try:
        loaded = load(str(lkg))
    except ConfigError as exc:
        note = f"config.on_invalid: lkg, but {lkg} fails too: {exc.problems[0]}"
        raise ConfigError(rejected.source, [*rejected.problems, note]) from None
    if loaded.state_dir.resolve() != state.resolve():  # moved, or restored elsewhere
        note = (f"config.on_invalid: lkg, but {lkg} names another state dir "
                f"({loaded.state_dir}): not used (was the state dir moved or restored?)")
        raise ConfigError(rejected.source, [*rejected.problems, note])
    loaded.path, loaded.text = path, text  # a reload (SIGHUP) reads the file again
    loaded.rejected = f"{rejected.source}: {rejected.problems[0]}"
    return loaded


def gateway_section_or_lkg(config_path: str | os.PathLike | None, rejected: ConfigError,
                           env: Mapping[str, str] | None = None,
                           **kwargs: Any) -> LoadedConfig:
    """For a command that only talks to the running gateway (``status``, ``agent``,
    ``gateway stop``): the ``gateway`` section of the last-known-good copy when the
    file's own (``rejected``: why) cannot be read, the case in which a gateway with
    ``on_invalid: lkg`` runs on that copy. ``rejected`` is set on the result. Raises
    ``rejected`` when there is no usable copy (none, invalid, or of another state dir).
    ``kwargs`` go to :func:`load_gateway_section`."""
    env = os.environ if env is None else env
    try:
        path, state = where(config_path, env)
        lkg = lkg_path(state)
        if not lkg.is_file():
            raise rejected
        loaded = load_gateway_section(str(lkg), env, **kwargs)
    except (ConfigError, OSError):
        raise rejected from None
    if loaded.state_dir.resolve() != state.resolve():
        raise rejected
    loaded.path = path  # the file (a reload reads it again), as load_or_lkg sets it
    loaded.rejected = f"{rejected.source}: {rejected.problems[0]}"
    return loaded


def lkg_note(loaded: LoadedConfig) -> str:
    """The stderr note of a command that reached the gateway through the copy."""
    return (f"note: the config file is invalid ({loaded.rejected}); the gateway section "
            f"of the last-known-good config {lkg_path(loaded.state_dir)} was used to reach "
            "the gateway (`tidegate config validate` names every problem)")


def problem_text(loaded: LoadedConfig) -> str:
    """The ``status`` problem of a gateway running on the last-known-good config."""
    return (f"config: {loaded.rejected} — the file was rejected; running on the "
            f"last-known-good config {lkg_path(loaded.state_dir)} (config.on_invalid: lkg)."
            " Fix: correct the file, then reload (SIGHUP) or restart; `tidegate config "
            "diff-lkg` shows what changed")


class LkgKeeper:
    """Keeps the gateway's config as last-known-good once it served ``config.lkg_after``
    (on the gateway's clock); ``watch`` starts over after a reload. Holds the status
    problem while the gateway runs on the last-known-good copy."""

    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.saved = asyncio.Event()  # set after each write (tests)
        self._task: asyncio.Task | None = None
        self._problem: str | None = None
        self._note(gw.loaded)

    def _note(self, loaded: LoadedConfig) -> None:
        problems = self.gw.problems
        before = self._problem
        if before in problems:
            problems.remove(before)
        self._problem = problem_text(loaded) if loaded.rejected else None
        if self._problem:
            problems.append(self._problem)
        if self._problem and self._problem != before:  # once per rejection, not per call
            log.error("config_rejected_running_lkg", rejected=loaded.rejected,
                      lkg=str(lkg_path(loaded.state_dir)))

    async def start(self) -> None:
        self.watch(self.gw.loaded)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def watch(self, loaded: LoadedConfig) -> None:
        """A config was (re)loaded: keep it once it has served ``lkg_after``."""
        self._note(loaded)
        if self._task is not None:
            self._task.cancel()
            self._task = None
        after = loaded.config.config.lkg_after
        if loaded.path is None or loaded.text is None or loaded.rejected or after <= 0:
            return
        self._task = asyncio.get_running_loop().create_task(self._after(loaded, after))

    async def _after(self, loaded: LoadedConfig, after: float) -> None:
        await self.gw.clock.sleep(after)
        if self.gw.loaded is not loaded or self.gw.stopping or not self.gw.ready:
            return
        try:
            if keep(loaded):
                log.info("config_lkg_saved", path=str(lkg_path(loaded.state_dir)),
                         source=str(loaded.path))
        except OSError as exc:
            log.warning("config_lkg_unwritable", path=str(lkg_path(loaded.state_dir)),
                        error=str(exc))
        self.saved.set()
