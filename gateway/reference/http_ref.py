"""The HTTP API reference, read from the gateway's real route table
(``gateway.server.http.build_app``) with every optional surface switched on: webchat, the
OpenAI-compatible API, metrics, a Telegram webhook, Slack's Events API and the WhatsApp
webhook.

The app is built around a stand-in gateway object (no state dir, nothing started): route
functions only capture the gateway when they are built. Each route's description is the
docstring of the innermost handler (a wrapper such as ``require_token`` is looked
through), else of the function that made the route.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from channels.slack.adapter import SlackChannel as SlackAdapter
from channels.slack.config import SlackChannelConfig
from channels.telegram.adapter import TelegramChannel as TelegramAdapter
from channels.telegram.config import TelegramChannelConfig
from channels.whatsapp.adapter import WhatsAppChannel as WhatsAppAdapter
from channels.whatsapp.config import WhatsAppChannelConfig
from gateway.config.schema import Config
from gateway.server.http import build_app

# How a route that does not go through ``require_token`` checks its caller, by the module
# of its handler.
_OWN_AUTH = {
    "/": "none (the page asks for the token)",
    "/ws": "token, in `?token=`",
    "channels.openai_api": "token",
    "channels.telegram": "`X-Telegram-Bot-Api-Secret-Token`",
    "channels.slack": "Slack request signature",
    "channels.whatsapp": "`X-Hub-Signature-256` (POST), `hub.verify_token` (GET)",
    "gateway.server.metrics": "token, or none with `metrics.public_loopback`",
}
_NO_AUTH = {"/healthz", "/readyz"}
# Callables a route's closure holds that are not its handler.
_NOT_HANDLERS = {"bearer_ok", "authorize", "require_token"}


@dataclass(frozen=True)
class Route:
    """``method`` (GET, POST, ...), ``path`` (aiohttp's pattern: ``/api/cron/{id}``),
    ``auth`` (text), ``description`` (the handler's docstring summary, '' if none),
    ``surface`` (control API, webchat, OpenAI-compatible API, ...)."""

    method: str
    path: str
    auth: str
    description: str
    surface: str


class _Anything:
    """A stand-in for whatever a route function reads off the gateway while building."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Anything()

    def __iter__(self) -> Iterator[Any]:
        return iter(())


class _Platform:
    """A channel whose ``http_routes`` is the real adapter's, on a config in webhook /
    HTTP mode."""

    def __init__(self, adapter: type, config: Any) -> None:
        self.config, self._adapter = config, adapter
        if hasattr(adapter, "_handle_http"):  # Slack's route is its bound method
            self._handle_http = types.MethodType(adapter._handle_http, self)

    def http_routes(self) -> Any:
        return self._adapter.http_routes(self)


class _StandInGateway(_Anything):
    def __init__(self) -> None:
        self.token = "docs"
        self.config = Config.model_validate({
            "channels": {"webchat": {"enabled": True}, "openai_api": {"enabled": True}},
            "metrics": {"enabled": True}})
        self.channels = [
            _Platform(TelegramAdapter, TelegramChannelConfig.model_validate(
                {"enabled": True, "token": "1:docs", "mode": "webhook",
                 "webhook_secret": "docs"})),
            _Platform(SlackAdapter, SlackChannelConfig.model_validate(
                {"enabled": True, "bot_token": "xoxb-docs", "mode": "http",
                 "signing_secret": "docs"})),
            _Platform(WhatsAppAdapter, WhatsAppChannelConfig.model_validate(
                {"enabled": True, "access_token": "docs", "phone_number_id": "1",
                 "app_secret": "docs", "verify_token": "docs"})),
        ]


def _inner(fn: Any, depth: int = 0) -> Any:
    """The innermost callable of our own code behind wrappers and lambdas (a function
    with a docstring of its own is the handler)."""
    if depth > 5 or (depth and inspect.getdoc(fn)):
        return fn
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if getattr(value, "__name__", "") in _NOT_HANDLERS:
            continue
        if callable(value) and getattr(value, "__module__", "").split(".")[0] in (
                "gateway", "channels") and not isinstance(value, type):
            if not inspect.isfunction(value) and not inspect.ismethod(value):
                continue
            return _inner(value, depth + 1)
    return fn


def _called(fn: Any) -> Any:
    """The function of our own code a lambda handler calls (``lambda request:
    handle_webhook(self, request)``), else ``fn``."""
    for name in getattr(getattr(fn, "__code__", None), "co_names", ()):
        target = getattr(fn, "__globals__", {}).get(name)
        if inspect.isfunction(target) and inspect.getdoc(target):
            return target
    return fn


def _summary(fn: Any) -> str:
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.split("\n\n", 1)[0].split()).replace("``", "`")


def _surface(module: str, path: str) -> str:
    if module.startswith("channels.openai_api"):
        return "OpenAI-compatible API"
    if module.startswith("channels.webchat"):
        return "Control UI and webchat"
    if module.startswith(("channels.telegram", "channels.slack", "channels.whatsapp")):
        return "Platform webhooks"
    if path in _NO_AUTH or path == "/metrics":
        return "Probes and metrics"
    return "Control API"


def routes() -> list[Route]:
    """Every route of the gateway's HTTP server, in the order they are added."""
    app = build_app(_StandInGateway())
    out = []
    for resource in app.router.resources():
        for route in resource:
            if route.method == "HEAD":
                continue
            handler = route.handler
            inner = _inner(handler)
            if getattr(inner, "__name__", "") == "<lambda>":
                inner = _called(inner)
            module = getattr(inner, "__module__", "") or ""
            path = resource.canonical
            if path in _NO_AUTH:
                auth = "none"
            elif getattr(handler, "__qualname__", "") == "require_token.<locals>.wrapped":
                auth = "token"
            else:
                auth = _OWN_AUTH.get(path) or next(
                    (v for k, v in _OWN_AUTH.items() if module.startswith(k)), "token")
            desc = _summary(inner)
            if not desc and getattr(inner, "__name__", "") == "<lambda>":
                desc = _summary(getattr(inner, "__self__", None) or _owner(module, path))
            out.append(Route(route.method, path, auth, desc, _surface(module, path)))
    return out


def _owner(module: str, path: str) -> Any:
    for adapter in (TelegramAdapter, SlackAdapter, WhatsAppAdapter):
        if module.startswith(adapter.__module__.rsplit(".", 1)[0]):
            return adapter.http_routes
    return None


def render() -> str:
    """The Markdown of ``docs/reference/http-api.md``."""
    out = ["# HTTP API reference", "",
           ("<!-- Generated by `python -m gateway.reference` from the route table; do not "
           "edit by hand. -->"), "",
           ("Every route of the gateway's HTTP server (loopback only, `gateway.bind`:"
           "`gateway.port`, default `127.0.0.1:18789`), generated from the route table "
           "with every optional surface switched on. **token** means `Authorization: "
           "Bearer <gateway token>` (`tidegate dashboard` prints it; it is in "
           "`<state_dir>/gateway.token`). Webhook paths are the defaults of "
           "`channels.telegram.webhook_path`, `channels.slack.events_path` and "
           "`channels.whatsapp.webhook_path`. See "
           "[HTTP API](../http-api.md) for examples."), ""]
    by_surface: dict[str, list[Route]] = {}
    for r in routes():
        by_surface.setdefault(r.surface, []).append(r)
    for surface in ("Probes and metrics", "Control API", "Control UI and webchat",
                    "OpenAI-compatible API", "Platform webhooks"):
        rows = by_surface.get(surface, [])
        if not rows:
            continue
        out += [f"## {surface}", "", "| method | path | auth | description |",
                "|---|---|---|---|"]
        for r in rows:
            desc = r.description.replace("|", "\\|")
            out.append(f"| {r.method} | `{r.path}` | {r.auth} | {desc} |")
        out.append("")
    return "\n".join(out).strip() + "\n"
