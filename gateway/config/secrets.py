"""Which values of the config are secrets, by name (what exec children never get and what
tool results never show the model: runtime/tools/secrets.py).

A secret is

- a ``${VAR}`` reference whose variable name looks like a secret (``*TOKEN*``,
  ``*SECRET*``, ``*KEY*``, ``*PASSWORD*``, ``*CREDENTIAL*``...) or that sits under a
  secret-looking key (``token``, ``api_key``, ``signing_secret``, ``password``,
  ``Authorization``...): named by the variable (``OPENAI_API_KEY``);
- a value written literally under a secret-looking key: named by its config path
  (``channels.telegram.token``);
- a secret-named variable of the env file (``<state_dir>/tidegate.env``), referenced or
  not: named by the variable (:func:`env_file_secrets`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from runtime.tools.secrets import SecretScrubber

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")
_SECRET_KEY = re.compile(r"token|secret|passw|api[_-]?key|authorization|credential",
                         re.IGNORECASE)
_SECRET_VAR = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|PRIVATE_?KEY|CREDENTIAL|_KEY$",
                         re.IGNORECASE)


def configured_secrets(tree: Any, env: Mapping[str, str]) -> tuple[dict[str, str],
                                                                    frozenset[str]]:
    """``(named, referenced)`` of a parsed config tree *before* ``${VAR}`` substitution:
    ``named`` maps each secret's name to its value (unset variables are left out);
    ``referenced`` is every variable name the config references as a secret, set or not
    (exec children never get one)."""
    named: dict[str, str] = {}
    referenced: set[str] = set()

    def walk(node: Any, path: str, secret: bool) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k),
                     secret or bool(_SECRET_KEY.search(str(k))))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}.{i}", secret)
        elif isinstance(node, str):
            refs = list(_ENV_REF.finditer(node))
            for m in refs:
                name = m.group(1)
                if secret or _SECRET_VAR.search(name):
                    referenced.add(name)
                    if env.get(name):
                        named.setdefault(name, env[name])
            if secret and not refs and node:
                named.setdefault(path, node)

    walk(tree, "", False)
    return named, frozenset(referenced)


def env_file_secrets(values: Mapping[str, str]) -> dict[str, str]:
    """The env file's variables whose names look like secrets (module docstring)."""
    return {k: v for k, v in values.items() if _SECRET_VAR.search(k) and v}


def secret_scrubber(loaded: Any, runtime: dict[str, str] | None = None) -> SecretScrubber:
    """The scrubber of a loaded config's named secrets, the env file's secret-named values
    and ``runtime``: the secrets the gateway holds that no config names (``gateway.token``,
    the control API's bearer token: :func:`runtime_secrets`). Built once per load and
    runtime set."""
    extra = tuple(sorted((runtime or {}).items()))
    cached = loaded.__dict__.get("_scrubber")
    if cached is None or cached[0] != extra:
        env_file = getattr(loaded, "env_file", None)
        named = {**env_file_secrets(env_file.values if env_file else {}), **loaded.secrets,
                 **dict(extra)}
        cached = loaded.__dict__["_scrubber"] = (extra, SecretScrubber(named))
    return cached[1]


def runtime_secrets(gw: Any) -> dict[str, str]:
    """``{name: value}`` of the secrets the gateway itself holds: the control API token
    (from ``gateway.auth_token`` or ``<state_dir>/gateway.token``), which can approve
    requests and change the config, and the PostgreSQL DSN (``storage.dsn``) when it holds
    a password (whole, and the password alone)."""
    token = getattr(gw, "token", None)
    out = {"gateway.token": token} if isinstance(token, str) and token else {}
    dsn = getattr(getattr(gw.config, "storage", None), "dsn", None)
    if isinstance(dsn, str) and (password := _dsn_password(dsn)):
        out["storage.dsn"], out["storage.dsn.password"] = dsn, password
    return out


def _dsn_password(dsn: str) -> str | None:
    """The password a PostgreSQL DSN holds (URL ``user:pw@`` or ``password=`` in the
    query or key=value form), else None."""
    import re
    from urllib.parse import parse_qs, unquote, urlsplit
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
            pw = parts.password or (parse_qs(parts.query).get("password") or [None])[0]
        except ValueError:
            return None
        return unquote(pw) if pw else None
    m = re.search(r"(?:^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn)
    return m.group(1).strip("'") if m else None
