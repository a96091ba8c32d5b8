"""SSRF guard for ``web_fetch``: refuse URLs whose host is, or resolves to, a loopback,
private, link-local (cloud metadata 169.254.169.254 included), CGNAT, multicast, reserved or
unspecified address — every resolved address is checked, at connect time (so DNS
rebinding between check and connect cannot slip through) and again for every redirect hop
(issue 12). ``allow_private`` turns the address check off (tests, trusted intranets).
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any
from urllib.parse import urlsplit

import structlog
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

log = structlog.get_logger(__name__)

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_PORTS = {"http": 80, "https": 443}
METADATA_HOSTS = {"metadata.google.internal", "metadata", "instance-data"}


class FetchRefused(Exception):
    """A URL the guard will not fetch (message says why; logged as ``web_fetch_refused``)."""


def address_problem(ip: str) -> str | None:
    """Why connecting to ``ip`` is refused, or None for a public address."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    for flag in ("is_loopback", "is_link_local", "is_private", "is_multicast",
                 "is_reserved", "is_unspecified"):
        if getattr(addr, flag):
            return f"{addr} is a {flag[3:].replace('_', '-')} address"
    if isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT:
        return f"{addr} is a shared (CGNAT) address"
    return None


def trusted(host: str, port: int | None, allow_hosts: frozenset[str]) -> bool:
    """``host`` or ``host:port`` is in ``tools.web.fetch.allow_hosts`` (intranet hosts the
    operator trusts: exempt from the address check, nothing else)."""
    return host in allow_hosts or f"{host}:{port}" in allow_hosts


def check_url(url: str, *, allow_private: bool,
              allow_hosts: frozenset[str] = frozenset()) -> None:
    """Scheme and literal-host checks (names are checked when resolved). Raises
    FetchRefused."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise FetchRefused(f"only http and https URLs can be fetched, not {parts.scheme!r}")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise FetchRefused("the URL has no host")
    if parts.username or parts.password:
        raise FetchRefused("URLs with credentials are not fetched")
    if allow_private or trusted(host, parts.port or _PORTS[parts.scheme], allow_hosts):
        return
    if host == "localhost" or host.endswith(".localhost") or host in METADATA_HOSTS:
        raise FetchRefused(f"{host} is a local or metadata host")
    try:
        problem = address_problem(host)
    except ValueError:
        return  # a name: checked by GuardedResolver when it is resolved
    if problem:
        raise FetchRefused(problem)


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that refuses a host when ANY of its addresses is blocked."""

    def __init__(self, *, allow_private: bool,
                 allow_hosts: frozenset[str] = frozenset()) -> None:
        self._inner = DefaultResolver()
        self.allow_private = allow_private
        self.allow_hosts = allow_hosts

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[dict[str, Any]]:
        infos = await self._inner.resolve(host, port, family)
        if not (self.allow_private or trusted(host.lower(), port, self.allow_hosts)):
            for info in infos:
                problem = address_problem(info["host"])
                if problem:
                    log.warning("web_fetch_refused", host=host, reason=problem)
                    raise FetchRefused(f"{host} resolves to a blocked address ({problem})")
        return infos

    async def close(self) -> None:
        await self._inner.close()
