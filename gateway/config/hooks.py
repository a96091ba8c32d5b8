"""``hooks.<name>``: inbound webhooks (gateway/hooks/). A signed POST to the hook's path
starts a turn (or queues a system event) in a named session, its text made from the
JSON body by ``message_template``; the reply goes to ``deliver`` and/or back in the HTTP
response (``wait``)."""


import re
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from runtime.config_types import ConfigModel, Duration

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
DEFAULT_TEMPLATE = "Webhook {{hook}} delivered:\n{{.}}"


class HookConfig(ConfigModel):
    """One webhook. ``signature``: ``github`` (``X-Hub-Signature-256: sha256=<hex>``,
    delivery id ``X-GitHub-Delivery``), ``hmac-sha256`` (``X-Signature-256:
    sha256=<hex>``, delivery id ``X-Delivery-Id``) — both HMAC-SHA256 of the raw body
    with ``secret`` — or ``none``."""

    path: str | None = Field(
        None,
        description=("The URL path of this hook under /hooks/ on the gateway's HTTP server; "
                     "null = /hooks/<name>."))
    secret: str | None = Field(
        None,
        description=("The shared secret the sender signs the body with (keep it in the env "
                     "file: ${GITHUB_WEBHOOK_SECRET}); required unless signature is none."))
    signature: Literal["hmac-sha256", "github", "none"] = Field(
        "hmac-sha256",
        description=("github (X-Hub-Signature-256) | hmac-sha256 (X-Signature-256) | none "
                     "(anyone who can reach the path may post)."))
    agent: str | None = Field(
        None,
        description="The agent whose session it runs in; null = the default agent.")
    session: str | None = Field(
        None,
        description=("The session key the turn runs in (main = the agent's main session); "
                     "null = agent:<agent>:hook:<name>."))
    action: Literal["turn", "event"] = Field(
        "turn",
        description=("turn (start a turn now) | event (queue a system event in the session "
                     "and wake it, like a finished command)."))
    message_template: str = Field(
        DEFAULT_TEMPLATE,
        description=("The turn's text: {{a.b}} is that field of the JSON body (list items by "
                     "number: {{commits.0.id}}), {{.}} the whole body, {{hook}} the hook's "
                     "name, {{event}} the event header (X-GitHub-Event)."))
    deliver: str | None = Field(
        None,
        description=("Where the reply goes: a channel target <channel>:<to>[:<thread>], e.g. "
                     "telegram:1001, on an installed, enabled chat platform; null = nowhere "
                     "but the HTTP response (wait)."))
    wait: bool = Field(
        False,
        description=("Answer the POST with the reply (200 {reply}) instead of 202 at once; "
                     "the sender waits up to timeout."))
    timeout: Duration = Field(
        120.0,
        description="wait: how long the POST waits for the reply before 504.")
    max_body: int = Field(
        262144, ge=1, le=4 * 1024 * 1024,
        description="The largest body accepted, in bytes; bigger gets 413.")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.signature != "none" and not self.secret:
            raise ValueError(f"secret: required for signature {self.signature} (or set "
                             "signature: none)")
        if self.path is not None and not re.fullmatch(r"/hooks/[A-Za-z0-9._~/-]+", self.path):
            raise ValueError("path: must start with /hooks/ (letters, digits, . _ ~ / -)")
        if self.action == "event" and self.wait:
            raise ValueError("wait: a system event has no reply to wait for (action event)")
        return self


def hook_path(name: str, hook: HookConfig) -> str:
    """The URL path ``hook`` answers on."""
    return hook.path or f"/hooks/{name}"


def _deliver_problem(name: str, target: str, config: Any) -> str | None:
    """Why ``hooks.<name>.deliver`` cannot work: not ``<channel>:<to>``, a channel no
    installed plugin has (``hooks.<name>.deliver.channel``, the installed ones in the
    hint), or a platform that is not enabled; else None."""
    from channels import registry
    from runtime import plugins
    if len(target.split(":")) < 2:
        return f"hooks.{name}.deliver: expected <channel>:<to>[:<thread>]"
    channel = target.split(":", 1)[0].strip().lower()
    if plugins.find("channel", channel) is None:
        return (f"hooks.{name}.deliver.channel: {channel!r} in {target!r}: "
                f"{registry.unknown_channel(channel, local=False)}")
    problem = config.target_problem(target)
    return f"hooks.{name}.deliver: {problem}" if problem else None


def hooks_problem(config: Any) -> str | None:
    """The first cross-section problem of ``hooks`` (a bad name, an unknown agent, a
    session of another agent, a delivery target that cannot work, two hooks on one path),
    as ``hooks.<name>.<key>: ...``, or None."""
    from gateway.routing import agent_of_key, canonical_key
    ids, paths = config.agent_ids(), {}
    for name, hook in config.hooks.items():
        if not _NAME.fullmatch(name):
            return (f"hooks.{name}: a hook name is 1-64 of a-z 0-9 _ - (starting with a "
                    "letter or digit)")
        agent = (hook.agent or config.default_agent()).lower()
        if agent not in ids:
            return f"hooks.{name}.agent: unknown agent {hook.agent!r} (have: {', '.join(ids)})"
        if hook.session not in (None, "main"):
            try:
                owner = agent_of_key(canonical_key(hook.session))
            except ValueError as exc:
                return f"hooks.{name}.session: {exc}"
            if owner != agent:
                return (f"hooks.{name}.session: {hook.session!r} belongs to agent {owner!r}, "
                        f"the hook runs agent {agent!r}")
        if hook.deliver is not None:
            problem = _deliver_problem(name, hook.deliver, config)
            if problem:
                return problem
        other = paths.setdefault(hook_path(name, hook), name)
        if other != name:
            return f"hooks.{name}.path: {hook_path(name, hook)} is already hooks.{other}'s"
    return None
