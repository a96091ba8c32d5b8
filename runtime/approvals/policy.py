"""What ``tools.exec`` says about one command (docs/exec.md): run it, deny it, or ask the
approvers.

``security``: ``deny`` (never), ``allowlist`` (a command matching ``allowlist`` or a
stored "always allow" pattern runs; any other is a miss), ``full`` (any command).
``ask``: ``off`` (a miss is denied), ``on-miss`` (a miss asks), ``always`` (every command
asks, allowlisted or not — but ``security: deny`` never asks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.approvals.match import (
    NotPlain,
    expanded_words,
    first_match,
    parse_command,
    resolve_binary,
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """``action``: run | deny | ask; ``reason``: for the model, the log and the request
    text; ``argv``/``binary``: the parsed command (None when it is not a plain command);
    ``matched``: the allowlist pattern that matched."""

    action: str
    reason: str
    argv: list[str] | None = None
    binary: str | None = None
    matched: str | None = None


def exec_verdict(rules: Any, command: str, stored: list[str], *, path: str | None,
                 cwd: str | None) -> Verdict:
    """The verdict for ``command`` under ``rules`` (an ``ExecRules``) and the agent's
    stored "always allow" patterns."""
    if rules.security == "deny":
        return Verdict("deny", "exec is disabled for this agent (tools.exec.security: deny)")
    try:
        argv = parse_command(command)
    except NotPlain as exc:
        argv, binary, why = None, None, f"not one plain command ({exc})"
    else:
        binary = resolve_binary(argv[0], path, cwd)
        why = "not in the allowlist"
    expanded = expanded_words(command) if argv is not None else frozenset()
    matched = None
    if argv is not None and rules.security == "allowlist":
        matched = first_match(list(rules.allowlist) + stored, argv, path=path, cwd=cwd,
                              expanded=expanded)
    allowed = rules.security == "full" or matched is not None
    if expanded and not allowed:  # its words are file names nobody saw: no "always"
        argv, why = None, (f"{why}; the shell expands its unquoted wildcards or ~, so "
                           "it cannot be always allowed")
    if rules.ask == "always":
        return Verdict("ask", "every command asks (tools.exec.ask: always)", argv, binary,
                       matched)
    if allowed:
        return Verdict("run", f"allowlisted ({matched})" if matched else "security: full",
                       argv, binary, matched)
    if rules.ask == "on-miss":
        return Verdict("ask", why, argv, binary)
    return Verdict("deny", f"{why} (tools.exec.security: allowlist)", argv, binary)
