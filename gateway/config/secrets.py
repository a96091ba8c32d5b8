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
