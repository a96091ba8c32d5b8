"""Names in tool-policy keys must name something that exists: a misspelt provider under
``tools.by_provider`` (``opnai``) would otherwise silently disable its deny list, and
``config validate``, ``tools check`` and ``doctor`` would say OK (docs/config-checks.md)."""

from __future__ import annotations

import difflib
from typing import Any


def did_you_mean(name: str, known: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known``, else ``""``."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def policy_key_problem(cfg: Any) -> str | None:
    """The first ``<path>: unknown provider ...`` among the ``by_provider`` keys of
    ``tools`` and of every agent's ``tools`` (a key is a provider of ``models.providers``,
    ``echo``, or ``<provider>/<model>`` of one), None when all are known."""
    known = sorted({*cfg.models.providers, "echo"})
    tables = [("tools.by_provider", cfg.tools.by_provider)]
    defaults = cfg.agents.defaults.tools.by_provider
    tables.append(("agents.defaults.tools.by_provider", defaults))
    for agent_id in cfg.agent_ids():
        own = {k: v for k, v in cfg.agent(agent_id).tools.by_provider.items()
               if k not in defaults}
        tables.append((f"agents.list.{agent_id}.tools.by_provider", own))
    for path, table in tables:
        for key in table:
            provider = key.split("/", 1)[0]
            if provider not in known:
                return (f"{path}.{key}: unknown provider {provider!r}"
                        f"{did_you_mean(provider, known)}; have: {', '.join(known)} "
                        f"(a misspelt key would silently skip its rules)")
    return None
