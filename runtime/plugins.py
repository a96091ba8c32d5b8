"""Plugin discovery through Python entry points (``importlib.metadata``).

Three groups: ``tidegate.channels`` (chat platforms, ``channels/sdk.py``),
``tidegate.tools`` and ``tidegate.providers``. A plugin is an ordinary installed
distribution that declares an entry point in one of them; tidegate's own built-ins
(Telegram, Slack, Discord, WhatsApp, Matrix, email) are entry points of the ``tidegate``
distribution itself, so they go through exactly this code.

:func:`discover` lists what is installed (nothing imported); :func:`load` imports one
entry and checks the SDK version it declares. A plugin that fails to import, or declares
another major SDK version, disables only itself: :class:`PluginInfo.error` says why, the
traceback is logged once per process (event ``plugin_load_failed``), and the gateway
lists it in ``status`` problems.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

GROUPS = {"channel": "tidegate.channels", "tool": "tidegate.tools",
          "provider": "tidegate.providers"}
OWN_DISTRIBUTION = "tidegate"
SDK_VERSION = "1.1"  # major.minor of the plugin contract (channels/sdk.py)

log = logging.getLogger("tidegate.plugins")


@dataclass
class PluginInfo:
    """One entry point: ``name`` (the key under ``channels.*`` for a channel), ``kind``
    (channel | tool | provider), ``target`` (``module:attr``), the distribution's
    ``package`` and ``version``, ``source`` (``builtin`` for tidegate's own, else
    ``package``). After :func:`load`: ``value`` (the loaded object) or ``error`` (one
    line; ``detail`` has the traceback)."""

    name: str
    kind: str
    target: str
    package: str
    version: str
    source: str
    value: Any = field(default=None, repr=False)
    error: str | None = None
    detail: str | None = field(default=None, repr=False)
    loaded: bool = False

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: name, kind, version, source, package, target, state, error."""
        state = "failed" if self.error else ("loaded" if self.loaded else "found")
        return {"name": self.name, "kind": self.kind, "version": self.version,
                "source": self.source, "package": self.package, "target": self.target,
                "sdk_version": getattr(self.value, "sdk_version", None),
                "state": state, "error": self.error}


_found: dict[str, list[PluginInfo]] = {}
_logged: set[tuple[str, ...]] = set()
_reporter: Callable[[PluginInfo], None] | None = None


def discover(kind: str) -> list[PluginInfo]:
    """The installed entry points of ``kind`` (see :data:`GROUPS`), built-ins first, then
    by package and name; cached for the process (:func:`forget` clears it). Nothing is
    imported. Two entries with one name: the first (built-in) wins, the other is listed
    with an error."""
    if kind not in _found:
        from importlib.metadata import entry_points
        infos: list[PluginInfo] = []
        for ep in entry_points(group=GROUPS[kind]):
            dist = getattr(ep, "dist", None)
            package = dist.name if dist is not None else "?"
            infos.append(PluginInfo(
                name=ep.name.lower(), kind=kind, target=ep.value, package=package,
                version=dist.version if dist is not None else "?",
                source="builtin" if package == OWN_DISTRIBUTION else "package"))
        infos.sort(key=lambda i: (i.source != "builtin", i.package, i.name))
        seen: set[str] = set()
        for info in infos:
            if info.name in seen:
                info.error = (f"{kind} plugin {info.name!r} from {info.package} is ignored: "
                              "another installed plugin has that name")
                info.loaded = True
            seen.add(info.name)
        _found[kind] = infos
    return _found[kind]


def check_sdk(name: str, package: str, declared: Any) -> str | None:
    """Why a plugin declaring SDK ``declared`` cannot run here (another major version,
    or none declared), or None."""
    text = str(declared or "")
    major = text.split(".", 1)[0]
    if not declared:
        return (f"plugin {name!r} ({package}) declares no sdk_version; this tidegate "
                f"provides SDK {SDK_VERSION}")
    if not major.isdigit():
        return (f"plugin {name!r} ({package}) declares sdk_version {text!r}, which is "
                f"not a version (major.minor); this tidegate provides SDK {SDK_VERSION}")
    if major != SDK_VERSION.split(".", 1)[0]:
        return (f"plugin {name!r} ({package}) targets SDK {text}; this tidegate provides "
                f"SDK {SDK_VERSION} (install a version of the plugin built for "
                f"{SDK_VERSION.split('.')[0]}.x)")
    return None


def load(info: PluginInfo) -> Any:
    """Import the entry point once and return its object (a callable is called with no
    arguments to get it), or None when it failed: ``info.error`` says why and the
    traceback is logged once. The object must carry ``sdk_version``."""
    if info.loaded:
        return info.value
    info.loaded = True
    from importlib.metadata import EntryPoint
    try:
        value = EntryPoint(info.name, info.target, GROUPS[info.kind]).load()
        if callable(value) and not hasattr(value, "sdk_version"):
            value = value()
    except Exception as exc:  # noqa: BLE001 - a broken plugin disables only itself
        info.error = (f"{info.kind} plugin {info.name!r} ({info.package} {info.version}) "
                      f"failed to load: {type(exc).__name__}: {exc}")
        info.detail = traceback.format_exc()
        _log_once(info)
        return None
    problem = check_sdk(info.name, info.package, getattr(value, "sdk_version", None))
    if problem:
        info.error = problem
        _log_once(info)
        return None
    if newer := newer_minor(getattr(value, "sdk_version", None)):
        import structlog
        structlog.get_logger(__name__).warning("plugin_sdk_newer", plugin=info.name, package=info.package,
                    targets=newer, provides=SDK_VERSION,
                    effect="it loads; features of the newer SDK are missing here")
    info.value = value
    return value


def newer_minor(declared: Any) -> str | None:
    """``declared`` when it is a later minor version of this SDK's major (the plugin may
    use what this tidegate lacks: a warning, not a refusal), else None."""
    try:
        got = tuple(int(x) for x in str(declared).split(".")[:2])
        have = tuple(int(x) for x in SDK_VERSION.split(".")[:2])
    except ValueError:
        return None
    return str(declared) if len(got) == 2 and got[0] == have[0] and got > have else None


@contextlib.contextmanager
def reported_by(report: Callable[[PluginInfo], None] | None) -> Iterator[None]:
    """While the block runs, a plugin that fails to load is told to ``report(info)``
    (once per plugin) instead of the ``plugin_load_failed`` log line with its traceback:
    the CLI's one line on stderr. ``None``: the log line (the gateway)."""
    global _reporter
    before, _reporter = _reporter, report
    try:
        yield
    finally:
        _reporter = before


def _log_once(info: PluginInfo) -> None:
    key = (info.kind, info.name) if _reporter is None else (info.kind, info.name, "report")
    if key in _logged:
        return
    _logged.add(key)
    if _reporter is not None:
        _reporter(info)
        return
    _log_line(info, checked=True)


def _log_line(info: PluginInfo, *, checked: bool = False) -> None:
    key = (info.kind, info.name)
    if not checked:
        if key in _logged:
            return
        _logged.add(key)
    import structlog
    structlog.get_logger(__name__).error(
        "plugin_load_failed", plugin=info.name, kind=info.kind, package=info.package,
        version=info.version, error=info.error, traceback=info.detail)


def log_failures() -> None:
    """Log ``plugin_load_failed`` for every plugin found so far that failed to load and
    was not logged yet: the gateway loads its config under ``reported_by`` (holding the
    lines back) and calls this once its logging is set up, so they are in the JSON log."""
    for infos in list(_found.values()):
        for info in infos:
            if info.error:
                _log_line(info)


def loaded(kind: str) -> dict[str, Any]:
    """``{name: object}`` of every plugin of ``kind`` that loads (failures skipped)."""
    out: dict[str, Any] = {}
    for info in discover(kind):
        value = load(info)
        if value is not None and info.error is None:
            out[info.name] = value
    return out


def find(kind: str, name: str) -> PluginInfo | None:
    """The entry of ``kind`` called ``name`` (case-insensitive), or None."""
    name = name.lower()
    return next((i for i in discover(kind) if i.name == name), None)


def problems() -> list[str]:
    """One line per plugin that failed to load (for ``status`` problems)."""
    return [i.error for kind in _found for i in _found[kind] if i.error]


def forget() -> None:
    """Drop the discovery cache (tests; ``plugins doctor`` after an install)."""
    _found.clear()
