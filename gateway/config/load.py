"""Finding, reading and validating config.yaml.

Lookup order (issue 2): ``--config PATH``, else ``$TIDEGATE_CONFIG``, else
``~/.tidegate/config.yaml`` when it exists, else built-in defaults. ``${VAR}`` and
``${VAR:-default}`` are substituted in string values after YAML parsing (so a secret can
never inject YAML). Every problem is collected and reported at once with its dotted path
(``channels.telegram.token: required when channels.telegram is enabled``).
``$TIDEGATE_STATE_DIR`` overrides ``gateway.state_dir``. With ``env_file=`` (every CLI
command passes one) the variables of ``<state_dir>/tidegate.env`` fill in what the process
environment does not set (gateway/config/env_file.py).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gateway.config.env_file import EnvFileChoice, EnvFileError, EnvFileValues, read_chosen
from gateway.config.quick import DEFAULT_STATE_DIR, QuickGateway, quick_gateway

if TYPE_CHECKING:
    from gateway.config.gateway_section import GatewaySection
    from gateway.config.schema import Config


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (YAML would silently keep the last one)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _mapping_without_duplicates)

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


class ConfigError(Exception):
    """Invalid configuration. ``problems`` is a list of ``"dotted.path: what was expected"``;
    ``source`` is the file (or "defaults")."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"invalid config ({self.source}):"]
        lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)


@dataclass
class LoadedConfig:
    """A validated config with where it came from. ``env_file``: the env file read (its
    values in ``env_file.values``; ``path`` None when none was); ``env``: the variables
    ``${VAR}`` were substituted from (the process environment over the env file)."""

    config: Config
    path: Path | None
    raw: dict[str, Any] = field(default_factory=dict)
    env_file: EnvFileValues = field(default_factory=EnvFileValues)
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    secrets: dict[str, str] = field(default_factory=dict)
    secret_refs: frozenset[str] = frozenset()
    text: str | None = None  # the file as written (${VAR} references, not their values)
    rejected: str | None = None  # on the last-known-good config: why the file was refused

    @property
    def state_dir(self) -> Path:
        return self.config.gateway.state_path

    @property
    def instance_id(self) -> str:
        """16 hex chars of SHA-256 over the resolved state dir: what ``/healthz`` reports,
        so a CLI can tell whether the gateway on a port is its own (without learning
        anything about another installation)."""
        return hashlib.sha256(os.path.realpath(self.state_dir).encode()).hexdigest()[:16]


def resolve_config_path(explicit: str | os.PathLike | None,
                        env: Mapping[str, str] | None = None) -> Path | None:
    """Pick the config file per the lookup order; None means built-in defaults.

    Raises ConfigError when an explicitly named file (flag or env) does not exist.
    """
    env = os.environ if env is None else env
    for given, origin in ((explicit, "--config"), (env.get("TIDEGATE_CONFIG"), "TIDEGATE_CONFIG")):
        if given:
            p = Path(given).expanduser()
            if not p.is_file():
                raise ConfigError(str(p), [f"{origin}: file not found: {p}"])
            return p
    default = Path(DEFAULT_STATE_DIR).expanduser() / "config.yaml"
    return default if default.is_file() else None


def substitute_env(value: Any, env: Mapping[str, str], path: str = "",
                   problems: list[str] | None = None, *, strict: bool = True,
                   used: set[str] | None = None) -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string of a parsed YAML tree.

    A reference to an unset variable without a default is reported as a problem at its
    path; with ``strict=False`` it is left as written (CLI commands other than the gateway
    itself do not need the secrets, which may live only in the service's env file).
    Substituted values are added to ``used`` (so error messages can redact them).
    """
    problems = [] if problems is None else problems
    if isinstance(value, dict):
        return {k: substitute_env(v, env, f"{path}.{k}" if path else str(k), problems,
                                  strict=strict, used=used) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_env(v, env, f"{path}.{i}", problems, strict=strict, used=used)
                for i, v in enumerate(value)]
    if isinstance(value, str) and "${" in value:
        def repl(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            got = env.get(name)
            if got is None or (got == "" and default is not None):
                if default is not None:
                    return default
                if not strict:
                    return m.group(0)
                problems.append(f"{path}: environment variable {name} is not set")
                return ""
            if used is not None and len(got) >= 4:
                used.add(got)
            return got

        return _ENV_REF.sub(repl, value)
    return value


def parse_config(data: Any, source: str = "config",
                 env: Mapping[str, str] | None = None, *,
                 strict_env: bool = True,
                 env_file_values: Mapping[str, str] | None = None) -> LoadedConfig:
    """Validate an already-parsed YAML document. Raises ConfigError.
    ``env_file_values``: the env file's variables (its secret-named ones are secrets
    even when the config never references them: ``tools.exec.env`` may not hold them)."""
    env = os.environ if env is None else env
    if data is None:
        data = {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(source, [f"<root>: expected a mapping of sections, got {kind}"])
    from pydantic import ValidationError

    from gateway.config.schema import Config  # ~70 model classes: ~50 ms to import
    from runtime.config_types import format_validation_error
    # `channels:` with every child commented out is YAML null: that section's defaults;
    # a null key the schema does not know (`chanels:`) stays, to be named as unknown
    known = {key for name, field in Config.model_fields.items()
             for key in (name, field.alias) if key}
    data = {k: v for k, v in data.items() if v is not None or k not in known}
    problems: list[str] = []
    from_env: set[str] = set()
    from gateway.config.secrets import configured_secrets, env_file_secrets
    secrets, secret_refs = configured_secrets(data, env)
    unreferenced = env_file_secrets(env_file_values or {})
    unsubstituted = data
    data = substitute_env(data, env, "", problems, strict=strict_env, used=from_env)
    if env.get("TIDEGATE_STATE_DIR"):
        data.setdefault("gateway", {})
        if isinstance(data["gateway"], dict):
            data["gateway"]["state_dir"] = env["TIDEGATE_STATE_DIR"]
            data["gateway"].pop("stateDir", None)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        problems += format_validation_error(exc, Config)
        for secret in sorted(from_env, key=len, reverse=True):  # env values may be secrets
            problems = [p.replace(secret, "***") for p in problems]
        raise ConfigError(source, problems) from None
    from gateway.backup.config import backup_dir_problem
    problems += (exec_env_problems(cfg, {**unreferenced, **secrets}, secret_refs,
                                   unsubstituted)
                 + sandbox_problems(cfg))
    problems += [why] if (why := backup_dir_problem(cfg)) else []
    if problems:
        raise ConfigError(source, problems)
    return LoadedConfig(config=cfg, path=None, raw=data, secrets=secrets,
                        secret_refs=secret_refs)


def sandbox_problems(cfg: Config) -> list[str]:
    """A configured sandbox whose backend cannot run here (bwrap missing, no Docker
    daemon): a start-up error naming the key, never a silent fallback to the host. Also
    any agent's workspace that holds the state dir (its file tools would reach it)."""
    from runtime.sandbox.wrap import unavailable
    out = []
    for agent_id in cfg.agent_ids():
        sb = cfg.agent(agent_id).sandbox
        where = "agents.defaults" if not cfg.agents.list else f"agents.list.{agent_id}"
        if sb.mode != "off" and (why := unavailable(sb)):
            out.append(f"{where}.sandbox.backend: {sb.backend}: {why}")
        if sb.mode != "off" and (why := _workspace_overlap(cfg, agent_id)):
            out.append(f"{where}.workspace: {why}")
        if why := _state_dir_inside(cfg, agent_id):
            out.append(f"{where}.workspace: {why}")
    return sorted(set(out))


def _state_dir_inside(cfg: Config, agent_id: str) -> str | None:
    """Why a workspace that holds the state dir cannot be used, sandbox or not: the file
    tools run on the host and reach everything under the workspace, so the agent could
    read and rewrite the state (approvals.json, the control token, the config)."""
    ws = Path(os.path.realpath(cfg.workspace_for(agent_id)))
    state = Path(os.path.realpath(cfg.gateway.state_path))
    if state == ws or ws in state.parents:
        return (f"{ws} holds the state dir {state} (gateway.state_dir), which the agent's "
                "file tools must never reach; give the agent a workspace outside it, or "
                "move gateway.state_dir out of the workspace")
    home = state / "workspace"
    if state in ws.parents and ws != home and home not in ws.parents:
        return (f"{ws} lies inside the state dir {state} but outside its workspace/ "
                "folder: the agent's tools would see the state there (transcripts, "
                f"sessions); use a directory under {home} or outside the state dir")
    return None


def _workspace_overlap(cfg: Config, agent_id: str) -> str | None:
    """Why a sandboxed agent's workspace cannot be used: it is the state dir or the home
    directory, which the sandbox must hide (it is bound read-write). A workspace that
    merely contains them is fine: they are hidden inside it."""
    ws = Path(os.path.realpath(cfg.workspace_for(agent_id)))
    for what, d in (("the state dir (gateway.state_dir)", cfg.gateway.state_path),
                    ("the home directory", Path.home())):
        if ws == Path(os.path.realpath(d)):
            return (f"{ws} is {what}, which sandboxed commands must not see; give the "
                    "agent a workspace of its own (e.g. a directory inside it)")
    return None


def exec_env_problems(cfg: Config, secrets: dict[str, str], refs: frozenset[str],
                      raw: Any = None) -> list[str]:
    """``tools.exec.env`` entries that would hand a command a secret, one problem per key
    (``agents.defaults.tools.exec.env.X: ...``): a variable named like one the config
    references as a secret, a value referencing such a variable anywhere in it
    (``"Bearer ${GITHUB_TOKEN}"``: ``raw`` is the document before substitution), or a
    value containing a configured secret (``secrets``: the config's and the env file's
    secret-named values; at least 6 characters, so short ones do not match by chance)."""
    values = {v for v in secrets.values() if len(v) >= 6}
    out, named = [], set()
    for where, name, value in _raw_exec_envs(raw):
        used = [m.group(1) for m in _ENV_REF.finditer(value) if m.group(1) in refs]
        if used:
            named.add(name)  # one problem per key: the reference says the most
            out.append(f"{where}.tools.exec.env.{name}: references {', '.join(used)}, "
                       "a configured secret; commands never get secrets")
    for agent_id in cfg.agent_ids():
        where = "agents.defaults" if not cfg.agents.list else f"agents.list.{agent_id}"
        for name, value in cfg.agent(agent_id).tools.exec.env.items():
            if name not in named and (name in refs or any(v in value for v in values)):
                out.append(f"{where}.tools.exec.env.{name}: is a configured secret; "
                           "commands never get secrets")
    return sorted(set(out))


def _raw_exec_envs(raw: Any) -> list[tuple[str, str, str]]:
    """``(where, name, value)`` of every string ``tools.exec.env`` entry of the
    unsubstituted document (``where``: ``agents.defaults`` or ``agents.list.<id>``)."""
    agents = raw.get("agents") if isinstance(raw, dict) else None
    if not isinstance(agents, dict):
        return []
    places = [("agents.defaults", agents.get("defaults"))]
    entries = agents.get("list") if isinstance(agents.get("list"), list) else []
    places += [(f"agents.list.{a.get('id')}", a) for a in entries if isinstance(a, dict)]
    out = []
    for where, section in places:
        tools = section.get("tools") if isinstance(section, dict) else None
        rules = tools.get("exec") if isinstance(tools, dict) else None
        env = rules.get("env") if isinstance(rules, dict) else None
        if isinstance(env, dict):
            out += [(where, str(k), v) for k, v in env.items() if isinstance(v, str)]
    return out


def load_config(explicit: str | os.PathLike | None = None,
                env: Mapping[str, str] | None = None, *,
                strict_env: bool = True,
                env_file: EnvFileChoice | None = None) -> LoadedConfig:
    """Find, read and validate the config. Raises ConfigError (never a traceback-worthy
    exception) for a missing file, bad YAML, bad encoding, invalid values or an env file
    that cannot be read or parsed. ``strict_env=False``: unset ``${VAR}`` references are
    not errors (CLI use). ``env_file``: read that env file too (the process environment
    ``env`` wins); None reads none."""
    env = os.environ if env is None else env
    path = resolve_config_path(explicit, env)
    text = read_config_text(path) if path is not None else None
    data = parse_yaml(text, path) if path is not None and text is not None else {}
    source = str(path) if path is not None else "built-in defaults"
    from_file = _env_file_values(data, env, env_file, source)
    merged = from_file.merged(env) if from_file.path else env
    loaded = parse_config(data, source, merged, strict_env=strict_env,
                          env_file_values=from_file.values if from_file.path else None)
    loaded.path, loaded.env_file, loaded.env, loaded.text = path, from_file, merged, text
    return loaded


def state_dir_of(data: Any, env: Mapping[str, str]) -> Path:
    """The state dir a parsed config document names (``$TIDEGATE_STATE_DIR`` first, then
    ``gateway.state_dir``/``stateDir`` with its ``${VAR}``s, then the default), before any
    validation: where its env file lives."""
    section = data.get("gateway") if isinstance(data, dict) else None
    section = section if isinstance(section, dict) else {}
    given = env.get("TIDEGATE_STATE_DIR") or section.get("state_dir", section.get("stateDir"))
    if not isinstance(given, str) or not given:
        given = DEFAULT_STATE_DIR
    return Path(substitute_env(given, env, strict=False)).expanduser()


def env_file_for(explicit: str | os.PathLike | None, env: Mapping[str, str],
                 choice: EnvFileChoice) -> EnvFileValues:
    """The env file ``load_config(explicit, env, env_file=choice)`` reads. Raises
    ConfigError."""
    path = resolve_config_path(explicit, env)
    data = _read_yaml(path) if path is not None else {}
    return _env_file_values(data, env, choice, str(path) if path else "built-in defaults")


def _env_file_values(data: Any, env: Mapping[str, str], choice: EnvFileChoice | None,
                     source: str) -> EnvFileValues:
    """The env file ``choice`` names for this document. Raises ConfigError."""
    if choice is None:
        return EnvFileValues()
    try:
        return read_chosen(choice, state_dir_of(data, env))
    except EnvFileError as exc:
        raise ConfigError(source, [f"<env file>: {exc}"]) from None


@dataclass
class GatewayView:
    """Just the ``gateway`` section, shaped like ``Config`` for ``LoadedConfig`` users that
    read only ``config.gateway`` (the control-API client)."""

    gateway: GatewaySection | QuickGateway


def load_gateway_section(explicit: str | os.PathLike | None = None,
                         env: Mapping[str, str] | None = None, *,
                         quick: bool = True,
                         env_file: EnvFileChoice | None = None) -> LoadedConfig:
    """Like ``load_config`` (same lookup, ``${VAR}`` and ``$TIDEGATE_STATE_DIR``
    rules) but validating only the ``gateway`` section: what a command that only talks to
    the running gateway needs (``agent -m``, ``chat``), without the ~50 ms the whole schema
    takes to import; a plain section skips pydantic altogether (``gateway/config/quick.py``).
    The running gateway validated the rest. ``quick=False``: always the whole
    ``GatewaySection`` (``shutdown_grace`` included). ``env_file`` as for
    ``load_config``. Raises ConfigError."""
    env = os.environ if env is None else env
    path = resolve_config_path(explicit, env)
    data = _read_yaml(path) if path is not None else {}
    source = str(path) if path is not None else "built-in defaults"
    if data is None:  # an empty file
        data = {}
    if not isinstance(data, dict):  # never fall back to the default state dir's gateway
        kind = type(data).__name__
        raise ConfigError(source, [f"<root>: expected a mapping of sections, got {kind}"])
    section = data.get("gateway")
    if section is None:  # absent, or left empty: defaults (as parse_config reads it)
        section = {}
    if not isinstance(section, dict):  # [], "", false: what the full load refuses too
        raise ConfigError(source, ["gateway: expected a mapping"])
    from_file = _env_file_values(data, env, env_file, source)
    env = from_file.merged(env) if from_file.path else env
    section = substitute_env(section, env, "gateway", strict=False)
    if env.get("TIDEGATE_STATE_DIR"):
        section = {**{k: v for k, v in section.items() if k != "stateDir"},
                   "state_dir": env["TIDEGATE_STATE_DIR"]}
    gateway = (quick_gateway(section) if quick else None) or _validated_gateway(section,
                                                                                 source)
    return LoadedConfig(config=GatewayView(gateway), path=path,  # type: ignore[arg-type]
                        raw={"gateway": section}, env_file=from_file, env=env)


def _validated_gateway(section: dict[str, Any], source: str) -> GatewaySection:
    from pydantic import ValidationError

    from gateway.config.gateway_section import GatewaySection
    from runtime.config_types import format_validation_error
    try:
        return GatewaySection.model_validate(section)
    except ValidationError as exc:
        raise ConfigError(source, [f"gateway.{p}" for p in
                                   format_validation_error(exc, GatewaySection)]) from None


def _read_yaml(path: Path) -> Any:
    """The parsed YAML document at ``path``. Raises ConfigError."""
    return parse_yaml(read_config_text(path), path)


def read_config_text(path: Path) -> str:
    """The text of the config file at ``path``. Raises ConfigError."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"<file>: cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"<file>: not UTF-8 text (byte {exc.start})"]) from None


def parse_yaml(text: str, path: Path | str) -> Any:
    """The YAML document in ``text`` (duplicate keys refused). Raises ConfigError naming
    ``path``."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(str(path), [f"<yaml>: {problem} at {where}"]) from None
