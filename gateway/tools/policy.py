"""The tool policy's layers read from config (seed 001 §4; runtime/tools/policy.py does
the narrowing and caching).

Layer paths as ``tools explain`` prints them:

1 ``tools.profile`` · 2 ``tools.by_provider.<p>.profile`` · 3 ``tools.allow/deny`` ·
4 ``tools.by_provider.<p>`` · 5 ``agents.<id>.tools`` (``agents.defaults.tools`` merged
with the list entry) · 6 ``agents.<id>.tools.by_provider.<p>`` · 7
``channels.<platform>[.accounts.<acct>].groups.<group>.tools`` or
``channels.<platform>.dm.tools`` · 8 ``agents.<id>.subagents.tools`` (subagent runs).

``by_provider`` keys are provider names (``models.providers`` keys) or full model refs
``provider/model``; a model ref entry wins over its provider's entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from channels.sections import account_configs
from gateway.config.schema import Config
from runtime.tools.config import ToolRules
from runtime.tools.policy import PROFILES, Layer, ToolPolicy, ToolScope, unknown_entries
from runtime.tools.registry import ToolRegistry


def _by_provider(table: dict[str, Any], provider: str, model: str | None) -> tuple[str, Any]:
    for key in (model, provider):
        if key and key in table:
            return key, table[key]
    return "", None


def _rules(number: int, name: str, path: str, rules: ToolRules | None) -> Layer:
    if rules is None:
        return Layer.of(number, name, path, None)
    return Layer.of(number, name, path, rules.allow, rules.deny)


def channel_rules(cfg: Config, scope: ToolScope) -> tuple[str, ToolRules | None]:
    """Layer 7's config path and rules for the scope's chat (none for local channels)."""
    section = cfg.channels.platform(scope.channel) if scope.channel not in (
        "webchat", "cli", "openai", "openai_api") else None
    if section is None:
        return "channels", None
    acc = account_configs(section).get(scope.account)
    acc = acc or section
    base = (f"channels.{scope.channel}" if acc is section
            else f"channels.{scope.channel}.accounts.{scope.account}")
    if scope.chat_type == "dm" or scope.group_id is None:
        return f"{base}.dm.tools", acc.dm.tools
    groups = acc.groups if isinstance(acc.groups, dict) else {}
    gid = scope.group_id.lower()
    for key in (k for k in groups if k.lower() == gid):
        return f"{base}.groups.{key}.tools", groups[key].tools
    if "*" in groups:
        return f"{base}.groups.*.tools", groups["*"].tools
    return f"{base}.groups.{scope.group_id}.tools", None


def layers_for(cfg: Config, scope: ToolScope, model: str | None = None) -> list[Layer]:
    """The policy layers (1-7, plus 8 for subagents) for ``scope``."""
    t = cfg.tools
    agent = cfg.agent(scope.agent_id)
    a_path = f"agents.{scope.agent_id}"
    model = model or agent.model_primary
    pkey, prov = _by_provider(t.by_provider, scope.provider, model)
    akey, aprov = _by_provider(agent.tools.by_provider, scope.provider, model)
    layers = [
        Layer.of(1, "profile", f"tools.profile={t.profile}", PROFILES[t.profile]),
        Layer.of(2, "provider profile",
                 f"tools.by_provider.{pkey}.profile={prov.profile}" if prov and prov.profile
                 else "tools.by_provider.<provider>.profile",
                 PROFILES[prov.profile] if prov and prov.profile else None),
        _rules(3, "global", "tools.allow/deny", t),
        _rules(4, "global provider", f"tools.by_provider.{pkey or scope.provider}", prov),
        _rules(5, "agent", f"{a_path}.tools", agent.tools),
        _rules(6, "agent provider", f"{a_path}.tools.by_provider.{akey or scope.provider}",
               aprov),
        _rules(7, "group/channel", *channel_rules(cfg, scope)),
    ]
    if scope.subagent_depth > 0:
        layers.append(_rules(8, "subagent", f"{a_path}.subagents.tools",
                             agent.subagents.tools))
    return layers


def _entries(path: str, rules: Any) -> Iterator[tuple[str, str]]:
    if rules is None:
        return
    for i, e in enumerate(rules.allow or []):
        yield f"{path}.allow[{i}]", e
    for i, e in enumerate(rules.deny or []):
        yield f"{path}.deny[{i}]", e


def config_entries(cfg: Config) -> Iterator[tuple[str, str]]:
    """Every allow/deny entry in the config with its path (for diagnostics)."""
    yield from _entries("tools", cfg.tools)
    for name, rules in cfg.tools.by_provider.items():
        yield from _entries(f"tools.by_provider.{name}", rules)
    for agent_id in cfg.agent_ids():
        s = cfg.agent(agent_id)
        yield from _entries(f"agents.{agent_id}.tools", s.tools)
        for name, rules in s.tools.by_provider.items():
            yield from _entries(f"agents.{agent_id}.tools.by_provider.{name}", rules)
        yield from _entries(f"agents.{agent_id}.subagents.tools", s.subagents.tools)
    for platform, section in cfg.channels.platforms().items():
        accounts = [(f"channels.{platform}", section)] + [
            (f"channels.{platform}.accounts.{aid}", acc) for aid, acc in
            (getattr(section, "accounts", None) or {}).items()]
        for base, acc in accounts:
            yield from _entries(f"{base}.dm.tools", acc.dm.tools)
            if isinstance(acc.groups, dict):
                for gid, g in acc.groups.items():
                    yield from _entries(f"{base}.groups.{gid}.tools", g.tools)


def diagnostics(cfg: Config, registry: ToolRegistry) -> list[str]:
    """One line per allow/deny entry that matches no known tool or group."""
    seen = dict.fromkeys(unknown_entries(config_entries(cfg), registry,
                                         registry.declared_plugins))
    return list(seen)


def provider_of(cfg: Config, agent_id: str) -> str:
    """The provider name of the agent's primary model (``echo`` without one)."""
    ref = cfg.agent(agent_id).model_primary
    return ref.split("/", 1)[0] if ref else "echo"


def build_policy(cfg: Config, registry: ToolRegistry) -> ToolPolicy:
    """A cached policy over ``registry`` reading layers from ``cfg``."""
    return ToolPolicy(registry, lambda scope: layers_for(cfg, scope))
