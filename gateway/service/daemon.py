"""The gateway daemon: builds every service from config, starts them in a fixed order and
stops them in reverse (issue 2 §4; DESIGN.md "Operations").

Start: state dir -> auth token -> providers, tools, agents -> timeline -> lanes, delivery,
intake -> scheduler -> HTTP server (control API, webchat, OpenAI-compatible API, webhooks)
-> channels -> READY. Stop (SIGTERM/SIGINT): STOPPING -> stop intake (channels, lanes
closed) -> let running turns finish up to ``gateway.shutdown_grace`` -> stop scheduler ->
flush stores and the timeline -> close the HTTP server.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from typing import Any

import structlog

from channels.access.activation import ActivationStore
from channels.access.pairing import PairingStore
from channels.base import Channel
from gateway.agents import (
    Agent,
    build_agent,
    failover_settings,
    provider_dicts,
    session_sees_images,
)
from gateway.channels.local import LocalChat
from gateway.config.load import LoadedConfig
from gateway.config.reload import ReloadReport
from gateway.inbound.intake import Intake
from gateway.inbound.media import build_media_intake
from gateway.journal.recorder import open_outcomes
from gateway.journal.resume import (
    import_legacy_pending,
    report_unfinished,
    resume_unfinished,
    stop_marked,
)
from gateway.journal.store import FILE_NAME as JOURNAL_FILE
from gateway.journal.store import IntakeJournal
from gateway.journal.tracking import JournalTracker
from gateway.outbound.delivery import Deliverer
from gateway.outbound.replies import ReplyFlow
from gateway.service import status, storage
from gateway.service.state_dir import load_or_create_token, lock_state_dir
from gateway.service.storage import session_store, transcript_store
from gateway.sessions.access import SessionsAccessImpl
from gateway.sessions.logs import SessionLogs
from gateway.subagents import GatewaySubagents
from gateway.tools.context import tool_context
from gateway.tools.services import (
    gateway_registry,
    policy_with_diagnostics,
    skill_catalog,
    warn_sandbox_limits,
)
from gateway.turns.commands import configured_models
from gateway.turns.executor import TurnExecutor
from gateway.turns.work import reply_route
from runtime.clock import SYSTEM_CLOCK, Clock
from runtime.events import EventBus
from runtime.lanes import LaneManager
from runtime.mcp.manager import McpManager
from runtime.providers.failover.profiles import AuthProfiles
from runtime.providers.registry import ProviderRegistry
from runtime.state_files import report_corrupt
from runtime.tool_loop import LoopBreaker
from runtime.tools.web.tools import WebTools

log = structlog.get_logger(__name__)



class Gateway:
    """One running gateway. ``await start()``, then ``await stop()``."""

    def __init__(self, loaded: LoadedConfig, *, clock: Clock = SYSTEM_CLOCK,
                 notifier: Any = None) -> None:
        self.loaded = loaded
        self.config = loaded.config
        self.started_config = loaded.config
        self.clock = clock
        self.notifier = notifier
        self.state_dir = loaded.state_dir
        self.started_at: float | None = None
        self.ready = False
        self.stopping = False
        self.abandoned_channels: list[str] = []  # stops left behind at shutdown
        self.start_abort = asyncio.Event()  # SIGTERM while start() waits for PostgreSQL
        self.bus = EventBus()
        self.agents: dict[str, Agent] = {}
        self.channels: list[Channel] = []
        self.channel_tasks: list[asyncio.Task] = []
        self.extra_services: list[Any] = []
        self.http: Any = None
        self.problems: list[str] = []
        self.reload_report = ReloadReport()  # the last SIGHUP's outcome (service/run.py)
        self.timeline_hooks: Any = None
        self.pg: Any = None  # the asyncpg pool when storage.backend is postgres (issue 15)
        self.pg_bridge: Any = None  # its blocking door (gateway.service.storage.bridge)
        self._lock_fd: int | None = None
        self._outbox_stop = asyncio.Event()
        self._outbox_task: asyncio.Task | None = None
        self.cluster: Any = None  # gateway.cluster.service.Cluster with storage postgres

    # -- construction --------------------------------------------------------------------
    def _mcp_tools_changed(self) -> None:
        """An MCP server's tool list changed: rebuild the agents' tool lists and stable
        prompt prefixes (only now — they stay byte-stable otherwise)."""
        if self.agents:
            self._build_agents()
            log.info("tools_refreshed", reason="mcp", tools=len(self.tools.names()))

    def build(self) -> None:
        cfg = self.config
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.token = load_or_create_token(self.state_dir, cfg.gateway.auth_token)
        self.providers = ProviderRegistry(provider_dicts(cfg), clock=self.clock)
        self.auth_profiles = AuthProfiles(provider_dicts(cfg), clock=self.clock,
                                          settings=failover_settings(cfg),
                                          state_path=self.state_dir / "auth-state.json",
                                          state_records=storage.records(self, "auth_state"))
        self.loop_breaker = LoopBreaker(self.clock)
        self.tools = gateway_registry(cfg)  # MCP servers add plugin:mcp:<server> tools
        self.web = WebTools(cfg.tools.web, self.clock)
        self.mcp = McpManager(cfg.mcp, cfg.tools.mcp, registry=self.tools, clock=self.clock,
                              state_dir=self.state_dir, on_change=self._mcp_tools_changed)
        self.tool_policy, self.tool_diagnostics = policy_with_diagnostics(cfg, self.tools)
        warn_sandbox_limits(cfg)
        self.sessions_access = SessionsAccessImpl(self)
        self.logs = SessionLogs(self.state_dir, self.clock, transcripts=transcript_store(self))
        self.outbox = storage.outbox(self)  # files, or PostgreSQL (gateway/service/storage)
        self.deliverer = Deliverer(clock=self.clock, outbox=self.outbox,
                                   typing_interval=cfg.messages.typing_interval)
        self.recorder = self.timeline_hooks.record if self.timeline_hooks else None
        self.hooks = self.timeline_hooks
        from gateway.usage import UsageService
        self.usage = UsageService(self)
        self.extra_services.append(self.usage)
        self._build_agents()
        self.executor = TurnExecutor(agents=self.agents, logs=self.logs, clock=self.clock,
                                     deliverer=self.deliverer, reset=cfg.session.reset,
                                     hooks=self.hooks,
                                     drain_events=lambda *a: self.scheduling.drain(*a),
                                     replies=ReplyFlow(
                                         deliverer=self.deliverer,
                                         settings=self._access_config,
                                         messages=lambda: self.config.messages),
                                     known_models=lambda: configured_models(self.config))
        q = cfg.messages.queue
        self.lanes = LaneManager(self.executor, caps=cfg.lanes.model_dump(), clock=self.clock,
                                 mode=q.mode, debounce=q.debounce, max_queue=q.cap,
                                 merge_key=lambda w: reply_route(w, self.intake.links))
        self._build_intake()
        self.local = LocalChat(self)
        self._open_journal()
        from gateway.scheduling.wiring import Scheduling
        self.scheduling = Scheduling(self)
        self.extra_services.append(self.scheduling)
        from gateway.channels.health import ChannelHealth
        self.channel_health = ChannelHealth(self, self.clock)
        self.extra_services.append(self.channel_health)
        from gateway.monitoring import DeadMansSwitch
        self.deadman = DeadMansSwitch(self)  # monitoring.ping_url
        self.extra_services.append(self.deadman)
        from gateway.server.metrics import GatewayMetrics
        self.metrics = GatewayMetrics(self)
        self.metrics.attach()
        self.subagents = GatewaySubagents(self)
        self.extra_services.append(self.subagents)
        from gateway.approvals.service import Approvals
        self.approvals = Approvals(self)  # the exec gate of every tool call
        self.extra_services.append(self.approvals)
        self.executor.sender_taint = self.approvals.sender_taint
        self.executor.stranger_of = self.approvals.stranger
        self.executor.outbound_files = self._outbound_files
        from gateway.backup.service import BackupService
        from gateway.config.lkg import LkgKeeper
        self.backup, self.lkg = BackupService(self), LkgKeeper(self)
        self.extra_services += [self.backup, self.lkg]
        from gateway.telemetry import Telemetry
        self.telemetry = Telemetry(self)  # telemetry.otlp: off unless an endpoint is set
        self.extra_services.append(self.telemetry)
        self.intake.subagents_text = self.subagents.chat_command
        from gateway.config.secrets import runtime_secrets, secret_scrubber
        from gateway.memory import MemoryHub
        self.memory = self.executor.memory = MemoryHub(
            cfg, self.state_dir, self.clock, self.auth_profiles,
            bridge=(lambda: storage.bridge(self)) if cfg.storage.backend == "postgres" else None,
            scrub=lambda text: secret_scrubber(self.loaded, runtime_secrets(self)).scrub(
                text, quiet=True))
        self.intake.memory_forget = self._forget

    def _build_intake(self) -> None:
        """Pairing, dedupe and the intake with its hooks into the rest of the gateway."""
        cfg = self.config
        self.pairing = PairingStore(self.state_dir, self.clock, problems=self.problems,
                                    records=storage.records(self, "pairing"))
        self.pairing.check()
        self.dedupe = storage.dedupe(self)
        self.intake = Intake(config=cfg, lanes=self.lanes, deliverer=self.deliverer,
                             clock=self.clock, dedupe=self.dedupe, pairing=self.pairing,
                             access_config=self._access_config, status_text=self.status_text,
                             bot_ids=self._bot_ids,
                             on_channel_event=self._channel_event)
        self.intake.media = build_media_intake(cfg, self.clock)
        from gateway.inbound.provenance import FileProvenance
        self.provenance = FileProvenance(self.state_dir / "media" / "provenance.jsonl")
        self.intake.provenance = self.provenance
        self.intake.sees_images = lambda a, key: session_sees_images(self.agents, a, key)
        self.intake.usage_text = self.usage.usage_text
        self.intake.activation = ActivationStore(self.state_dir / "channels" / "activation.json",
                                                 self.problems)

    def _open_journal(self) -> None:
        """The intake journal (gateway/journal); unreadable, the gateway runs without it
        (accepted messages are then not crash-safe) and says so in status."""
        self.journal = IntakeJournal(self.state_dir / JOURNAL_FILE, self.clock,
                                     fsync=self.config.gateway.journal_fsync)
        self.journal_tracker = JournalTracker(self.journal, self.tools.side_effecting)
        self.outcomes = open_outcomes(self)  # without the journal: timeline and log only
        try:
            self.journal.load()
            import_legacy_pending(self.state_dir, self.journal)
        except OSError as exc:
            report_corrupt("intake journal", self.journal.path, str(exc),
                           effect="accepted messages are not crash-safe until it is fixed",
                           fix="fix the file's permissions or move it aside, then restart",
                           problems=self.problems)
            return
        self.bus.subscribe(self.journal_tracker.on_runtime_event, deltas=False)  # tool events only
        self.intake.journal = self.executor.journal = self.journal_tracker
        self.outcomes.journal = self.journal
        self.journal_tracker.outcomes = self.outcomes

    def _build_agents(self) -> None:
        old = dict(self.agents)
        new: dict[str, Agent] = {}
        for agent_id in self.config.agent_ids():
            prev = old.get(agent_id)
            new[agent_id] = build_agent(
                agent_id, self.config, state_dir=self.state_dir, clock=self.clock,
                bus=self.bus, providers=self.providers, tools=self.tool_policy,
                tool_context=functools.partial(tool_context, self), recorder=self.recorder,
                store=prev.store if prev else session_store(self, agent_id),
                profiles=self.auth_profiles,
                breaker=self.loop_breaker, gate=self.usage.gate,
                batching=self.timeline_hooks,
                skills=skill_catalog(self.config, agent_id, self.state_dir, self.clock))
        self.agents.clear()
        self.agents.update(new)
        for agent in new.values():
            problem = agent.store.problem  # only this agent is out of service
            if problem and problem not in self.problems:
                self.problems.append(problem)

    def _access_config(self, channel: str, account: str) -> Any:
        from channels.sections import account_configs
        section = self.config.channels.platform(channel) if channel not in (
            "webchat", "cli", "openai", "openai_api") else None
        if section is None:
            return None  # local channels are trusted (token-authenticated)
        return account_configs(section).get(account)

    def _channel_event(self, key: str, text: str, source: str,
                       sender: tuple[str, str, str | None] | None = None) -> None:
        """A platform event (reaction, edit, pin) as a system event; ``sender``
        ``(agent, channel, sender id)``: a non-owner's taints the turn draining it."""
        why = self.approvals.sender_taint(*sender) if sender is not None else None
        self.scheduling.enqueue(key, text, source, taint=(why,) if why else ())

    def _bot_ids(self, channel: str, account: str) -> set[str]:
        ch = self.deliverer.find(channel, account)
        bot_id = ch.status().get("bot_id") if ch is not None else None
        return {str(bot_id)} if bot_id else set()

    # -- lifecycle -----------------------------------------------------------------------
    def _outbound_files(self) -> Any:
        """What a reply's attachments are checked with (loads with a first reply)."""
        from gateway.outbound.media import outbound_files
        return outbound_files(self)

    async def start(self) -> None:
        from gateway.channels.boot import create_channels, start_channels
        from gateway.server.http import start_http
        from gateway.tools.services import remove_stale_sandboxes

        self._lock_fd = lock_state_dir(self.state_dir)
        # Background threads (timeline writer, file I/O) hand the GIL back to the event
        # loop within 1 ms instead of the default 5 ms: a tail-latency fix, not a speedup.
        sys.setswitchinterval(0.001)
        if self.config.storage.backend == "postgres":  # waits for it, migrates, or raises
            from gateway.service.waiting import wait_for_database
            self.pg = await wait_for_database(self)
        from gateway.timeline_hooks import open_timeline
        self.timeline_hooks = await open_timeline(self)
        self.build()
        from gateway.journal.local import record_lost_local
        record_lost_local(self)  # local callers the last run died on: before new requests
        await remove_stale_sandboxes(self.config, self.state_dir)  # before any command
        self.channels = create_channels(self)
        if self.config.storage.backend == "postgres":  # replicas (gateway/cluster)
            from gateway.cluster.service import Cluster
            self.cluster = Cluster(self)
            await self.cluster.open()
        self.http = await start_http(self)  # a busy port fails before anything runs
        if self.timeline_hooks is not None:
            self.timeline_hooks.start()
        for service in list(self.extra_services):
            await service.start()
        self.mcp.start()
        await self.mcp.wait_started(self.config.tools.mcp.connect_timeout)
        self.intake.hold()  # journal entries left by the last run go first
        try:
            if self.cluster is not None:
                await self.cluster.start_channels()  # owned accounts; takeover resumes
            else:
                await start_channels(self)
            if self.intake.journal is not None and self.cluster is None:
                await resume_unfinished(self)
        finally:
            self.intake.release()
        self._outbox_task = asyncio.get_running_loop().create_task(
            self.outbox.run(self.deliverer.retry_from_outbox, self._outbox_stop))
        self.started_at = self.clock.time()
        self.ready = True
        log.info("gateway_ready", bind=self.config.gateway.bind, port=self.port,
                 agents=list(self.agents), state_dir=str(self.state_dir),
                 channels=[k for k, v in self.channel_status().items()
                           if v.get("state") != "disabled"])
        if self.notifier is not None:
            self.notifier.notify("READY=1", f"STATUS=serving on port {self.port}")

    @property
    def port(self) -> int | None:
        return self.http.port if self.http is not None else None

    async def _stop_channels(self) -> None:
        """Stop every channel side by side within ``gateway.channel_stop_timeout`` of
        gateway time (gateway/channels/stopping.py): a plugin whose stop() never returns,
        or ignores its cancellation, must not keep the process alive. The ones left
        behind are kept in ``abandoned_channels`` (the process exit does not wait)."""
        from gateway.channels.stopping import stop_channels
        self.abandoned_channels = await stop_channels(
            list(self.channels), timeout=self.config.gateway.channel_stop_timeout,
            clock=self.clock)

    async def stop(self) -> None:
        """Graceful stop: stop intake, drain lanes up to the grace period, flush, close."""
        if self.stopping:
            return
        self.stopping = True
        self.ready = False
        if self.notifier is not None:
            self.notifier.notify("STOPPING=1")
        log.info("gateway_stopping", grace_s=self.config.gateway.shutdown_grace)
        # Stop intake first (new messages are left to the platform's redelivery), let the
        # running turns finish with the channels still up to deliver their replies.
        self.lanes.close()
        self.intake.close()  # albums still waiting stay journaled for the next start
        for service in reversed(self.extra_services):  # no new heartbeat/cron turns
            try:
                await service.stop()
            except Exception:
                log.exception("service_stop_failed", service=type(service).__name__)
        cancelled = await self.lanes.drain(self.config.gateway.shutdown_grace)
        if cancelled:
            log.warning("turns_cancelled_at_shutdown", lanes=cancelled)
        # after the last turns: their spans and the metrics, at most CLOSE_TIMEOUT_S,
        # side by side with the channels' stop (inside its bound, not added to it)
        telemetry = asyncio.ensure_future(self.telemetry.close())
        if self.intake.journal is self.journal_tracker:
            stop_marked(self.journal)  # cut off by the operator: not charged at the next start
            report_unfinished(self.journal)  # they stay journaled for the next start
        await self.mcp.stop()  # after the turns: ends stdio servers, no orphans
        await self._stop_channels()
        await telemetry
        if self.cluster is not None:
            await self.cluster.close()
        self._outbox_stop.set()
        if self._outbox_task is not None:
            self._outbox_task.cancel()
        self.outbox.flush()  # writes still queued for a remote store land before we exit
        for agent in self.agents.values():
            await agent.store.close()
        if self.pg_bridge is not None:
            self.pg_bridge.close()
        if self.timeline_hooks is not None:
            await self.timeline_hooks.close()
        await self.logs.aclose()  # PostgreSQL: queued transcript lines committed
        self.journal.close()
        if self.dedupe is not None:
            self.dedupe.close()
        await self.intake.media.close()
        await self.memory.close()
        await self.providers.close()
        if self.http is not None:
            await self.http.close()
        if self.pg is not None:
            await self.pg.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the state-dir lock
            self._lock_fd = None
        log.info("gateway_stopped")

    async def reload(self, loaded: LoadedConfig,
                     env_changed: list[str] | None = None) -> list[str]:
        """Apply a new config (SIGHUP). Returns what needs a restart to take effect.
        ``env_changed``: env-file variable names whose value changed (for the log)."""
        from gateway.config.reload import restart_required
        from gateway.tools.services import apply_web_tools

        # Compared with what this process started with: reverting a change needs nothing.
        needs_restart = restart_required(self.started_config, loaded.config)
        self.loaded, self.config = loaded, loaded.config
        self.token = load_or_create_token(self.state_dir, self.config.gateway.auth_token)
        self.executor.reset = self.config.session.reset
        self.intake.apply_config(self.config)
        self.memory.apply_config(self.config)
        self.lanes.mode = self.config.messages.queue.mode
        self.lanes.debounce = self.config.messages.queue.debounce
        await self.providers.close()
        self.providers = ProviderRegistry(provider_dicts(self.config), clock=self.clock)
        self.auth_profiles.configure(provider_dicts(self.config),
                                     failover_settings(self.config))
        self.usage.budgets.cfg = self.config.budgets  # caps and shares apply live
        self.web.reconfigure(self.config.tools.web)  # the SSRF guard's keys apply live
        apply_web_tools(self.tools, self.config)  # tools.web.*.enabled too
        from gateway.inbound.media import reload_media_intake
        self.intake.media = await reload_media_intake(self.intake.media, self.config,
                                                      self.clock)
        await self.mcp.reconfigure(self.config.mcp, self.config.tools.mcp)
        await self.mcp.wait_started(self.config.tools.mcp.connect_timeout)
        self.tool_policy, self.tool_diagnostics = policy_with_diagnostics(
            self.config, self.tools, self.tool_policy)
        self._build_agents()
        await self.scheduling.reload()
        await self.backup.reconfigure()  # backup.schedule / backup.tz apply at once
        self.lkg.watch(loaded)  # kept as last-known-good once it has served a while
        log.info("config_reloaded", restart_required=needs_restart,
                 env_changed=env_changed or [])
        return needs_restart

    # -- status (gateway/service/status.py) -----------------------------------------------
    def status(self) -> dict[str, Any]:
        return status.gateway_status(self)

    def current_problems(self) -> list[str]:
        return status.current_problems(self)

    def models_status(self) -> dict[str, Any]:
        return status.models_status(self)

    def channel_status(self) -> dict[str, Any]:
        return status.channel_status(self)

    async def _forget(self, agent_id: str, msg: Any, args: str) -> str:
        from gateway.memory.forget import chat_forget
        hooks = self.timeline_hooks
        return await chat_forget(self.memory, hooks.timeline if hooks else None, agent_id,
                                 msg, args)

    def status_text(self, agent_id: str, session_key: str) -> str:
        return status.status_text(self, agent_id, session_key)
