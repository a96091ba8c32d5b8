"""The chat platforms installed as ``tidegate.channels`` plugins (``runtime/plugins.py``).

Every platform — the built-in ones (Telegram, Slack, Discord, WhatsApp, Matrix, email)
included — is an entry point
whose object is a ``channels.sdk.ChannelPlugin``. This module loads them on first use and
answers by name; the config (``channels/config.py``), the gateway's channel boot and the
CLI ask here instead of keeping their own list of platforms.

A plugin that fails to import, declares another major SDK version or breaks the contract
(a name other than its entry point's, a config model that does not extend the SDK's
account model) is left out; :func:`problems` names it.
"""

from __future__ import annotations

import difflib
from typing import Any

from runtime import plugins

LOCAL_CHANNELS = ("webchat", "openai_api")


def _contract_problem(name: str, value: Any) -> str | None:
    from pydantic import BaseModel
    config = getattr(value, "config", None)
    if getattr(value, "name", None) != name:
        return (f"channel plugin {name!r}: its ChannelPlugin is named "
                f"{getattr(value, 'name', None)!r}, the entry point {name!r}")
    if not (isinstance(config, type) and issubclass(config, BaseModel)
            and "dm_policy" in config.model_fields):
        return (f"channel plugin {name!r}: config must be a pydantic model extending "
                "channels.sdk.AccountConfig (the access policy is not optional)")
    if not callable(getattr(value, "create", None)):
        return f"channel plugin {name!r}: create(account_id, config, context) is missing"
    return None


def _load(info: plugins.PluginInfo) -> Any:
    checked = info.loaded
    value = plugins.load(info)
    if value is None or checked:
        return None if info.error else value
    problem = _contract_problem(info.name, value)
    if problem:
        info.error, info.value = problem, None
        plugins._log_once(info)
        return None
    return value


def channel_plugins(builtin_only: bool = False) -> dict[str, Any]:
    """``{name: ChannelPlugin}`` of every platform plugin that loads, built-ins first."""
    out = {}
    for info in plugins.discover("channel"):
        if builtin_only and info.source != "builtin":
            continue
        value = _load(info)
        if value is not None:
            out[info.name] = value
    return out


def channel_names() -> list[str]:
    """Names of the loaded platform plugins, built-ins first."""
    return list(channel_plugins())


def channel_plugin(name: str) -> Any:
    """The loaded plugin called ``name``, or None (unknown, or it failed to load)."""
    info = plugins.find("channel", name)
    return _load(info) if info is not None else None


def config_model(name: str) -> type | None:
    """The config model of ``channels.<name>``, or None."""
    plugin = channel_plugin(name)
    return plugin.config if plugin is not None else None


def config_model_or_problem(name: str) -> tuple[type | None, str | None]:
    """``(model, None)`` for a loaded plugin; ``(None, None)`` for one that failed to
    import (it disables only itself: not started, reported in status); ``(None, problem)``
    for a name no plugin has or a plugin built for another SDK major version (a
    start-up error naming the plugin)."""
    info = plugins.find("channel", name)
    if info is None:
        return None, unknown_channel(name)
    plugin = _load(info)
    if plugin is not None:
        return plugin.config, None
    if info.error and "SDK" in info.error:
        return None, info.error
    return None, None


def unknown_channel(name: str, *, local: bool = True) -> str:
    """The error for a channel name no installed plugin has: ``unknown channel (did you
    mean 'x'?): installed channel plugins are ...`` (those that load), then the ones that
    failed to load (``failed to load: ...``) and, with ``local``, the local channels
    (valid config sections, not delivery targets)."""
    known = list(channel_plugins())
    failed = [i.name for i in plugins.discover("channel") if i.name not in known]
    candidates = known + list(LOCAL_CHANNELS if local else ())
    close = difflib.get_close_matches(name.lower(), candidates, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    text = f"unknown channel{hint}: installed channel plugins are {', '.join(known) or 'none'}"
    if failed:
        text += f"; failed to load: {', '.join(failed)} (tidegate plugins doctor)"
    return text + (f"; local channels {', '.join(LOCAL_CHANNELS)}" if local else "")


def problems() -> list[str]:
    """One line per channel plugin that is installed but not usable."""
    return [i.error for i in plugins.discover("channel") if i.error]
