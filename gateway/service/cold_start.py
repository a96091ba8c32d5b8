"""What ``tidegate gateway`` does not do before it can answer (issue 9 "cold start to the
first answer ≤ 1 s").

- **Garbage collection is held while the process starts.** Importing ~700 modules and
  building the config models allocates hundreds of thousands of objects that live for the
  whole process; the cyclic collector walked them again and again (10–15% of start-up
  CPU). :func:`begin` disables it, :func:`finish` (the gateway is serving) re-enables it,
  after ``gc_policy.apply_gc_policy`` froze everything built so far.
- **aiohttp's default client TLS contexts get their CA roots on first use.** Importing
  ``aiohttp`` builds two ``SSLContext`` objects and loads the system CA bundle into each
  (~50 ms of CPU apiece), although the gateway on its default config makes no outgoing
  TLS connection through aiohttp at all (its HTTP server is plain loopback). Here the
  import runs with the CA loading deferred, and ``TCPConnector._get_ssl_context`` loads
  the roots before it hands a default context out. Fail-closed: a context without its
  roots verifies nothing and so refuses every peer; it never accepts one unchecked.
"""

from __future__ import annotations

import gc
import ssl
import sys
import threading
from typing import Any

_deferred: list[ssl.SSLContext] = []
_lock = threading.Lock()


def begin() -> None:
    """Hold the cyclic GC and import aiohttp with its default contexts' CA roots deferred.
    Call first thing in a process that becomes the gateway."""
    gc.disable()
    import_aiohttp_deferring_roots()


def finish() -> None:
    """The gateway serves: collect again (call after the GC policy froze start-up)."""
    gc.enable()


def import_aiohttp_deferring_roots() -> None:
    """Import ``aiohttp`` with its module-level client contexts' CA loading deferred to
    their first use (see the module docstring). No-op when aiohttp is already imported."""
    if "aiohttp" in sys.modules:
        return
    ssl.SSLContext.set_default_verify_paths = _defer  # type: ignore[method-assign]
    try:
        import aiohttp.connector
    finally:
        del ssl.SSLContext.set_default_verify_paths  # the C method again
    connector: Any = aiohttp.connector.TCPConnector
    choose = connector._get_ssl_context

    def _get_ssl_context(self: Any, req: Any) -> ssl.SSLContext | None:
        if req.is_ssl():  # plain HTTP (the local model server, webhooks) needs no roots
            load_deferred_roots()
        return choose(self, req)

    connector._get_ssl_context = _get_ssl_context


def _defer(ctx: ssl.SSLContext) -> None:
    _deferred.append(ctx)


def load_deferred_roots() -> None:
    """Load the system CA roots into the contexts whose loading was deferred (once)."""
    if not _deferred:
        return
    with _lock:
        while _deferred:  # popped once loaded: an empty list means every root is in
            _deferred[-1].set_default_verify_paths()
            _deferred.pop()
