"""The model chain: try, classify, decide (seed 001 §2.5 "尝试-分类-重试").

``ModelCaller.call`` walks the agent's models (``{primary, fallbacks}``) and, for each, the
provider's auth profiles (last_good first). Every attempt is one ``model_attempt`` log line
(run_id, provider, profile id, model, class, status, wait_ms, decision) — no traceback:
upstream failures are expected. Per error class:

- ``billing``: no retry; the profile rests ``cooldowns.billing`` (5 h); next profile/model.
- ``auth``: a command token is fetched again and retried once; else the profile rests
  ``cooldowns.auth`` (1 h); next profile.
- ``rate_limit``: a server wait (Retry-After, retry-after-ms, anthropic-ratelimit-*-reset)
  up to ``max_retry_wait`` is honoured in place; a longer one benches the profile for that
  long; without one, exponential backoff with jitter, ``retries`` times, then the profile
  rests ``cooldowns.rate_limit``.
- ``timeout``/``transient``: backoff retries on the same profile, then the next profile.
- ``context_overflow``: raised at once (the turn compacts and retries once).
- ``invalid_request``: raised at once, the provider's message logged.

Attempts per turn are capped by :class:`AttemptBudget` (``models.max_attempts``, 160, and
the turn's deadline). SDK retries are off, so this is the only retry policy.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from runtime import telemetry
from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.providers.base import DeltaCallback, ModelRequest, ModelResponse, ProviderError
from runtime.providers.failover.credentials import Credential, CredentialError
from runtime.providers.failover.errors import user_notice
from runtime.providers.failover.profiles import AuthProfiles

log = structlog.get_logger(__name__)

ECHO_REF = "echo/diagnostic"
MAX_BACKOFF = 30.0


@dataclass
class AttemptBudget:
    """Attempts left in one turn: at most ``max_attempts`` calls, none that would wait past
    ``deadline`` (the clock's monotonic seconds; None = no deadline)."""

    max_attempts: int = 160
    deadline: float | None = None
    used: int = 0


class ModelCallError(Exception):
    """The chain gave up. ``error_class`` is the deciding class (or ``attempts`` when the
    budget ran out); ``wait_s`` how long until a rate limit lifts, when known;
    ``attempts`` lists ``(model_ref, profile, error text)``; ``notice`` is what the user
    may be shown."""

    def __init__(self, error_class: str, attempts: list[tuple[str, str, str]],
                 wait_s: float | None = None) -> None:
        self.error_class = error_class
        self.attempts = attempts
        self.wait_s = wait_s
        self.notice = user_notice(error_class, wait_s)
        detail = "; ".join(f"{ref}[{prof}]: {err}" for ref, prof, err in attempts)
        super().__init__(f"model call failed ({error_class}): {detail or 'no usable profile'}")


# A failure that passes by itself first: a rate limit (some profile or model comes back
# after the wait, so "try again in N minutes" is the true notice even when others failed
# auth or billing), then timeouts and transient trouble ("try again shortly" is true: a
# profile that answered 500 has quota). Billing and auth only when nothing else failed:
# "the quota is used up" after a 402 on one profile and 500s on another was untrue.
_PRIORITY = ("rate_limit", "timeout", "transient", "billing", "auth", "invalid_request")


def _rank(cls: str | None) -> int:
    return _PRIORITY.index(cls) if cls in _PRIORITY else len(_PRIORITY)


def _telling(current: str | None, new: str | None) -> str | None:
    """Of two error classes met in one walk, the one the user is told about."""
    if current is None:
        return new
    return new if new is not None and _rank(new) < _rank(current) else current


def _decisive(tries: list[_Try]) -> _Try:
    """The model walk whose failure the user is told about (see _PRIORITY)."""
    return min(tries, key=lambda t: _rank(t.last_class)) if tries else _Try("", "", "")


def split_ref(ref: str) -> tuple[str, str]:
    provider, _, model = ref.partition("/")
    if not provider or not model:
        raise ValueError(f"model ref must be <provider>/<model>, got {ref!r}")
    return provider, model


@dataclass
class _Try:
    """The state of one model's walk over its profiles."""

    ref: str
    provider: str
    model: str
    failures: list[tuple[str, str, str]] = field(default_factory=list)
    last_class: str | None = None
    wait_s: float | None = None


class ModelCaller:
    """One agent's model chain over the gateway's providers and auth profiles."""

    def __init__(self, registry: Any, *, primary: str | None, fallbacks: list[str] | None = None,
                 timeout: float = 120.0, profiles: AuthProfiles | None = None,
                 agent_id: str = "main", clock: Clock = SYSTEM_CLOCK,
                 rng: random.Random | None = None, media: Any = None) -> None:
        self.registry = registry
        self.media = media  # runtime/media/vision.MediaPolicy: image parts per model
        self.chain = [primary or ECHO_REF, *(fallbacks or [])]
        self.timeout = timeout
        self.clock = clock
        self.profiles = profiles or AuthProfiles(None, clock=clock)
        self.agent_id = agent_id
        self.rng = rng or random.Random()

    def first_model(self, model_override: str | None = None) -> str:
        """The model ref a call would try first now: ``model_override`` (a session's
        ``/model``) or the chain, skipping models whose every profile is cooling down."""
        chain = list(dict.fromkeys([model_override, *self.chain] if model_override
                                   else self.chain))
        hit = self.profiles.would_use(chain)
        return hit[0] if hit else chain[0]

    def sees_images(self, model_override: str | None = None) -> bool:
        """Whether :meth:`first_model` takes image parts (``vision``, built-in defaults)."""
        return self.media is None or self.media.sees_images(self.first_model(model_override))

    def budget(self, turn_timeout: float | None) -> AttemptBudget:
        """A fresh per-turn budget (``turn_timeout`` seconds, None/0 = unbounded)."""
        deadline = self.clock.monotonic() + turn_timeout if turn_timeout else None
        return AttemptBudget(self.profiles.settings.max_attempts, deadline)

    async def call(self, request: ModelRequest, *, model_override: str | None = None,
                   on_delta: DeltaCallback | None = None, run_id: str | None = None,
                   budget: AttemptBudget | None = None,
                   on_error: Callable[..., None] | None = None,
                   control: Any = None,
                   before_send: Callable[[], Awaitable[None]] | None = None
                   ) -> tuple[ModelResponse, float]:
        """Run ``request`` down the chain. Returns (response, ms spent in model calls).
        Raises ModelCallError when no model/profile answered. ``on_error(model=ref,
        attempt=n, of=retries, error=text, error_class=cls, retry_in_s=s or None)`` is
        called for every failed call (the CLI shows retries as progress; metrics count
        them by class). Each attempt holds a slot of its provider
        (``models.providers.<p>.max_concurrent``); ``control`` (the turn's TurnControl)
        lets the turn give its lane cap back while it waits for one. ``before_send`` is
        awaited just before each attempt goes to its provider (the turn's last check
        that it may still call the model; what it raises ends the call)."""
        chain = [model_override, *self.chain] if model_override else self.chain
        budget = budget or self.budget(None)
        spent = [0.0]
        tries: list[_Try] = []
        for ref in dict.fromkeys(chain):
            try:
                t = _Try(ref, *split_ref(ref))
                provider = self.registry.get(t.provider)
            except (KeyError, ValueError) as exc:
                tries.append(_Try(ref, ref, "", [(ref, "-", str(exc))], "invalid_request"))
                continue
            tries.append(t)
            sent = await self.media.prepare(request, ref) if self.media is not None else request
            resp = await self._walk_profiles(t, provider, sent, on_delta, run_id, budget, spent,
                                             on_error, control, before_send)
            if resp is not None:
                return resp, spent[0]
            log.warning("model_failover", run_id=run_id, failed=ref, error_class=t.last_class)
        decisive = _decisive(tries)
        raise ModelCallError(decisive.last_class or "transient",
                             [f for t in tries for f in t.failures], decisive.wait_s)

    def _slot(self, provider_name: str, control: Any) -> Any:
        slot = getattr(self.registry, "slot", None)
        return slot(provider_name, control) if slot is not None else contextlib.nullcontext()

    async def _walk_profiles(self, t: _Try, provider: Any, request: ModelRequest,
                             on_delta: DeltaCallback | None, run_id: str | None,
                             budget: AttemptBudget, spent: list[float],
                             on_error: Callable[..., None] | None = None,
                             control: Any = None,
                             before_send: Any = None) -> ModelResponse | None:
        for cred in self.profiles.order(t.provider):
            left = self.profiles.cooling(t.provider, cred.profile)
            if left:
                ps = self.profiles.state.profile(t.provider, cred.profile)
                t.last_class = _telling(t.last_class, ps.cooldown_class)
                if ps.cooldown_class == "rate_limit":
                    t.wait_s = min(t.wait_s or left, left)
                self._log(run_id, t, cred, "skip", cls=ps.cooldown_class, wait=left,
                          status="cooling")
                continue
            resp = await self._try_profile(t, cred, provider, request, on_delta, run_id,
                                           budget, spent, on_error, control, before_send)
            if resp is not None:
                return resp
        return None

    async def _try_profile(self, t: _Try, cred: Credential, provider: Any,
                           request: ModelRequest, on_delta: DeltaCallback | None,
                           run_id: str | None, budget: AttemptBudget,
                           spent: list[float], on_error: Callable[..., None] | None = None,
                           control: Any = None, before_send: Any = None
                           ) -> ModelResponse | None:
        """Attempts on one profile until it answers (the response), must be left (None),
        or the whole call must stop (raises ModelCallError)."""
        settings = self.profiles.settings
        retries, refreshed, attempt = settings.retries, False, 0
        while True:
            if budget.used >= budget.max_attempts:
                self._log(run_id, t, cred, "stop", cls="attempts", status="budget")
                raise ModelCallError("attempts", t.failures, t.wait_s)
            key = await self._credential_key(t, cred, run_id)
            if key is None:
                return None
            budget.used += 1
            request.model, request.timeout, request.api_key = t.model, self.timeout, key
            t0 = time.perf_counter()
            try:
                async with self._slot(t.provider, control):
                    if before_send is not None:
                        await before_send()
                    t0 = time.perf_counter()  # waiting for a slot is not model time
                    with telemetry.span("model.attempt", {
                            "gen_ai.system": t.provider, "gen_ai.request.model": t.model,
                            "tidegate.auth_profile": cred.profile,
                            "tidegate.attempt": budget.used}) as sp:
                        resp = await provider.complete(request, on_delta)
                        if sp.is_recording():
                            _usage_attrs(sp, resp)
            except ProviderError as exc:
                spent[0] += (time.perf_counter() - t0) * 1000
                cls = exc.error_class
                decision, wait = self._decide(cls, exc, retries, refreshed, cred, budget, attempt)
                self._report(run_id, t, cred, exc, cls, decision, wait, attempt, on_error)
                if decision == "stop":
                    t.failures.append((t.ref, cred.profile, str(exc)))
                    raise ModelCallError(cls, t.failures) from None
                if decision == "refresh":
                    refreshed = True
                    cred.invalidate()
                elif decision == "retry":
                    retries -= 1
                    attempt += 1
                    await self.clock.sleep(wait)
                else:  # rotate
                    cooldown = max(settings.cooldown(cls), wait if cls == "rate_limit" else 0)
                    self._fail(t, cred, cls, str(exc), cooldown=cooldown)
                    if cls == "rate_limit":
                        t.wait_s = min(t.wait_s or cooldown, cooldown) if cooldown else t.wait_s
                    return None
                continue
            finally:
                request.api_key = None
            spent[0] += (time.perf_counter() - t0) * 1000
            self._answered(run_id, t, cred, resp, first=budget.used == 1)
            return resp

    async def _credential_key(self, t: _Try, cred: Credential, run_id: str | None
                              ) -> str | None:
        """The profile's API key, or None when it cannot be had (the profile cools down
        as an ``auth`` failure and the chain moves on)."""
        try:
            return await cred.get(self.clock)
        except CredentialError as exc:
            self._fail(t, cred, "auth", str(exc),
                       cooldown=self.profiles.settings.cooldown("auth"))
            self._log(run_id, t, cred, "rotate", cls="auth", status="credential",
                      error=str(exc))
            return None

    def _report(self, run_id: str | None, t: _Try, cred: Credential, exc: ProviderError,
                cls: str, decision: str, wait: float, attempt: int,
                on_error: Callable[..., None] | None) -> None:
        """A failed call: its ``model_attempt`` line and the caller's ``on_error``."""
        self._log(run_id, t, cred, decision, cls=cls, status=exc.status or exc.kind,
                  wait=wait, error=str(exc))
        if on_error is not None:
            on_error(model=t.ref, attempt=attempt + 1, of=self.profiles.settings.retries,
                     error=str(exc), error_class=cls,
                     retry_in_s=wait if decision == "retry" else None)

    def _answered(self, run_id: str | None, t: _Try, cred: Credential, resp: ModelResponse,
                  *, first: bool) -> None:
        """The profile answered: its state, the response's ``auth_profile``, the log."""
        self.profiles.state.success(t.provider, cred.profile, self.clock.time())
        resp.auth_profile = cred.profile
        self.profiles.note_answer(self.agent_id, t.ref, t.provider, cred.profile)
        self._log(run_id, t, cred, "return", status="ok", first=first)

    def _decide(self, cls: str, exc: ProviderError, retries: int, refreshed: bool,
                cred: Credential, budget: AttemptBudget, attempt: int) -> tuple[str, float]:
        """(decision, wait seconds): decision is retry | refresh | rotate | stop."""
        settings = self.profiles.settings
        if cls in ("context_overflow", "invalid_request"):
            return "stop", 0.0
        if cls == "auth":
            return ("refresh", 0.0) if cred.kind == "command" and not refreshed else \
                ("rotate", 0.0)
        if cls == "billing":
            return "rotate", 0.0
        server_wait = exc.retry_after if cls == "rate_limit" else None
        if server_wait is not None:
            wait = server_wait
            fits = wait <= settings.max_retry_wait
        else:
            wait = min(settings.backoff * (2 ** attempt), MAX_BACKOFF)
            wait *= 0.5 + self.rng.random() / 2  # jitter: many sessions do not retry in step
            fits = True
        if budget.deadline is not None and self.clock.monotonic() + wait >= budget.deadline:
            fits = False
        if fits and retries > 0:
            return "retry", wait
        return "rotate", (server_wait or 0.0)

    def _fail(self, t: _Try, cred: Credential, cls: str, error: str, *, cooldown: float) -> None:
        t.failures.append((t.ref, cred.profile, error))
        t.last_class = _telling(t.last_class, cls)
        self.profiles.state.failure(t.provider, cred.profile, cls, self.clock.time(), cooldown)

    @staticmethod
    def _log(run_id: str | None, t: _Try, cred: Credential, decision: str, *,
             cls: str | None = None, status: Any = None, wait: float = 0.0,
             error: str | None = None, first: bool = False) -> None:
        """One ``model_attempt`` line. An answer at the first attempt is logged at debug:
        ``turn_done`` already says the turn succeeded, and a line per turn at the default
        level is disk written per turn (issue 9 "Disk"); answers after a failure, and
        every failure, stay at info/warning."""
        fields = {"run_id": run_id, "provider": t.provider, "profile": cred.profile,
                  "model": t.model, "class": cls, "status": status,
                  "wait_ms": int(wait * 1000), "decision": decision}
        if error:
            fields["error"] = error[:500]
        if first:
            log.debug("model_attempt", **fields)
        else:
            (log.info if decision in ("return", "skip") else log.warning)("model_attempt",
                                                                           **fields)


def _usage_attrs(sp: Any, resp: ModelResponse) -> None:
    """The answered attempt's model and token counts on its span."""
    u = resp.usage
    sp.set_attributes({"gen_ai.response.model": resp.model or "",
                       "gen_ai.usage.input_tokens": u.input_tokens if u else 0,
                       "gen_ai.usage.output_tokens": u.output_tokens if u else 0,
                       "tidegate.usage.cache_read_tokens": u.cache_read_tokens if u else 0,
                       "tidegate.tool_calls": len(resp.tool_calls)})
