"""``tidegate models list [--json]`` (issue 14): every agent's model chain (primary, then
fallbacks), the provider each uses and its price (from config, else built in); config only.

``tidegate models status [--json]`` (issue 10): providers, auth profiles (state,
cooldown left, last error class, last_good), fallbacks and the model each agent would use
now — from the running gateway when it is up, else from config and
``<state_dir>/auth-state.json``. Also the credential and context-window checks of
``tidegate config validate``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gateway.cli.output import print_json
from gateway.config.load import LoadedConfig
from gateway.config.schema import Config


def config_findings(cfg: Config, env: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings) beyond the schema: an ``api_key_env`` that is unset, a model
    below ``context_guard.min`` (error) or ``warn_below`` (warning)."""
    from runtime.context.guard import check
    env = dict(os.environ) if env is None else env
    errors: list[str] = []
    warnings: list[str] = []
    for name, p in cfg.models.providers.items():
        for i, prof in enumerate(p.auth_profiles):
            if prof.api_key_env and not env.get(prof.api_key_env):
                errors.append(f"models.providers.{name}.auth_profiles.{i}.api_key_env: "
                              f"{prof.api_key_env} is not set (profile {prof.id!r})")
    for agent_id in cfg.agent_ids():
        settings = cfg.agent(agent_id)
        where = f"agents.list.{agent_id}" if cfg.agents.list else "agents.defaults"
        refs = [settings.model_primary or "echo/diagnostic", *settings.model_fallbacks]
        for ref in dict.fromkeys(refs):
            if ref.startswith("echo/"):
                continue
            v = check(ref, cfg.models.providers, fallback=settings.context_tokens,
                      guard=settings.context_guard, where=where)
            if v.level == "refuse":
                errors.append(f"{where}.model: {v.message}")
            elif v.level == "warn":
                warnings.append(f"{where}.model: {v.message}")
    return errors, warnings


async def probe_models(loaded: LoadedConfig, env: dict[str, str] | None = None
                       ) -> list[dict[str, Any]]:
    """One tiny request (``max_tokens: 1``) per model ref of every agent's chain and per
    auth profile of its provider: ``[{"ref", "profile", "ok", "detail"}]`` (``detail`` the
    error, keys redacted). A provider without ``auth_profiles`` has one, ``default``."""
    from runtime.clock import SYSTEM_CLOCK
    from runtime.providers.base import ChatMessage, ModelRequest, ProviderError
    from runtime.providers.failover.credentials import CredentialError
    from runtime.providers.failover.profiles import credentials_from_config
    from runtime.providers.registry import ProviderRegistry
    cfg = loaded.config
    refs = sorted({r for a in cfg.agent_ids() for r in
                   [cfg.agent(a).model_primary, *cfg.agent(a).model_fallbacks] if r})
    entries = {n: p.model_dump() for n, p in cfg.models.providers.items()}
    registry = ProviderRegistry(entries)
    from gateway.logs.redact import Redactor, config_secrets
    hide = Redactor(set(config_secrets(loaded)))
    out = []
    try:
        for ref in refs:
            provider, _, model = ref.partition("/")
            for cred in credentials_from_config(provider, entries.get(provider, {}), env):
                req = ModelRequest(model=model, system="Reply with OK.", system_dynamic="",
                                   messages=[ChatMessage(role="user", content="ping")],
                                   tools=[], max_tokens=1, temperature=None)
                req.timeout = 30.0
                row = {"ref": ref, "profile": cred.profile, "ok": True, "detail": "answers"}
                try:
                    req.api_key = await cred.get(SYSTEM_CLOCK)
                    await registry.get(provider).complete(req, None)
                except (ProviderError, CredentialError, KeyError) as exc:
                    # a provider's answer may echo the key: never printed
                    row.update(ok=False, detail=hide.redact(str(exc).replace(
                        req.api_key or "\0", "***")))
                out.append(row)
    finally:
        await registry.close()
    return out


def models_report(loaded: LoadedConfig) -> dict[str, Any]:
    """The running gateway's report, else one computed from config and the state file."""
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    try:
        out = ControlClient.from_config(loaded).request("GET", "/api/models", timeout=10)
        return {**out, "source": "gateway"}
    except (GatewayUnavailable, ApiError):
        pass
    from gateway.agents import failover_settings, provider_dicts
    from gateway.service.storage import offline_records
    from runtime.clock import SYSTEM_CLOCK
    from runtime.providers.failover.profiles import AuthProfiles
    cfg = loaded.config
    profiles = AuthProfiles(provider_dicts(cfg), clock=SYSTEM_CLOCK,
                            settings=failover_settings(cfg),
                            state_path=loaded.state_dir / "auth-state.json",
                            state_records=offline_records(loaded, "auth_state"))
    chains = {a: [cfg.agent(a).model_primary or "echo/diagnostic",
                  *cfg.agent(a).model_fallbacks] for a in cfg.agent_ids()}
    report = {**profiles.report(chains), "source": "state file"}
    if profiles.state.problem:  # the file is unreadable: what it held is unknown, not "ok"
        report["problems"] = [profiles.state.problem]
        for info in report["providers"].values():
            for row in info["profiles"]:
                row["state"] = "unknown"
        for chain in report["chains"].values():
            chain["would_use"] = None
    return report


def cmd_models_status(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    report = models_report(loaded)
    failed = 1 if report.get("problems") else 0
    if args.json:
        print_json(report)
        return failed
    print(f"(from the {report['source']})")
    for problem in report.get("problems", []):
        print(f"problem: {problem}")
    for name, info in report["providers"].items():
        print(f"provider {name}: last_good {info['last_good'] or '-'}")
        for p in info["profiles"]:
            left = f", cooling {p['cooldown_left_s']}s ({p['cooldown_class']})" \
                if p["state"] == "cooling" else ""
            print(f"  profile {p['id']} [{p['source']}]: {p['state']}{left}, last error "
                  f"{p['last_error_class'] or '-'}")
    for agent_id, c in report["chains"].items():
        now = c["would_use"]
        using = (f"{now['model']} (profile {now['profile']})" if now else
                 "unknown (state unreadable)" if failed else "none (all cooling)")
        print(f"agent {agent_id}: primary {c['primary']}, fallbacks "
              f"{', '.join(c['fallbacks']) or '-'}; would use {using}")
    if report.get("persistence") == "disabled":
        print("warning: auth-state.json is corrupt; profile state is not persisted",
              file=sys.stderr)
    return failed


def register(sub: Any) -> None:
    """Add the ``models`` command group to the CLI's subparsers (gateway/cli/main.py)."""
    m = sub.add_parser("models", help="model providers, auth profiles and failover state")
    msub = m.add_subparsers(dest="models_cmd", required=True, metavar="ACTION")
    st = msub.add_parser("status", help="providers, profiles, cooldowns, fallbacks")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_models_status)
    ls = msub.add_parser("list", help="every agent's model chain with provider and price")
    ls.add_argument("--json", action="store_true", help="machine-readable JSON")
    ls.set_defaults(func=cmd_models_list)
    rs = msub.add_parser("reset", help="put a benched auth profile back in service (after "
                         "topping up credits or fixing a key)")
    rs.add_argument("profile", metavar="PROFILE",
                    help="<provider>/<profile>, a profile id, or a provider (all its profiles)")
    rs.set_defaults(func=cmd_models_reset)


def cmd_models_reset(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    """Through the running gateway (its in-memory state is the live one), else in the
    state store directly."""
    from gateway.cli.client import ApiError, ControlClient, GatewayUnavailable
    try:
        out = ControlClient.from_config(loaded).request(
            "POST", "/api/models/reset", {"profile": args.profile}, timeout=10)
        done = out["reset"]
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except GatewayUnavailable:
        try:
            done = _offline_profiles(loaded).reset(args.profile)
        except LookupError as exc:
            print(f"error: {str(exc).strip(chr(39) + chr(34))}", file=sys.stderr)
            return 1
    print(f"reset {', '.join(done)}: back in service (no cooldown, failure count 0)")
    return 0


def _offline_profiles(loaded: LoadedConfig) -> Any:
    from gateway.agents import failover_settings, provider_dicts
    from gateway.service.storage import offline_records
    from runtime.clock import SYSTEM_CLOCK
    from runtime.providers.failover.profiles import AuthProfiles
    cfg = loaded.config
    return AuthProfiles(provider_dicts(cfg), clock=SYSTEM_CLOCK,
                        settings=failover_settings(cfg),
                        state_path=loaded.state_dir / "auth-state.json",
                        state_records=offline_records(loaded, "auth_state"))


def model_rows(loaded: LoadedConfig) -> list[dict[str, Any]]:
    from runtime.providers.failover.chain import ECHO_REF
    from runtime.usage.pricing import price_for
    cfg = loaded.config
    rows = []
    for agent_id in cfg.agent_ids():
        settings = cfg.agent(agent_id)
        chain = [settings.model_primary or ECHO_REF, *settings.model_fallbacks]
        for i, ref in enumerate(chain):
            provider, _, model = ref.partition("/")
            pcfg = cfg.models.providers.get(provider)
            price = price_for(provider, model, cfg.pricing)
            rows.append({"agent": agent_id, "role": "primary" if i == 0 else f"fallback {i}",
                         "model": ref, "api": pcfg.api if pcfg else "built-in",
                         "base_url": pcfg.base_url if pcfg else None,
                         "price_per_mtok": price.model_dump() if price else None})
    return rows


def cmd_models_list(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    rows = model_rows(loaded)
    if args.json:
        print_json(rows)
        return 0
    table = [("AGENT", "ROLE", "MODEL", "API", "PRICE $/Mtok in/out")]
    for r in rows:
        p = r["price_per_mtok"]
        table.append((r["agent"], r["role"], r["model"], r["api"],
                      f"{p['input']:g}/{p['output']:g}" if p else "-"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0
