"""What the intake (and the CLI's chat, the control API) sees as its lanes on a replica
(issue 15 "Lanes"): journaled platform messages and session commands go through
:class:`gateway.cluster.work.ClusterWork` to the replica that runs the session's lane;
anything else runs on the local :class:`runtime.lanes.LaneManager`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.cluster import commands
from gateway.cluster.forwarding import awaited
from gateway.cluster.work import ClusterWork, Forwarded
from gateway.turns.work import CommandWork, SyntheticWork, UserWork


class ClusterLanes:
    """What intake sees as its lanes: journaled messages go through :class:`ClusterWork`
    (cluster-wide lane), anything else to the local :class:`LaneManager`."""

    def __init__(self, work: ClusterWork) -> None:
        self.work = work
        self.local = work.local
        # (key, drop_queued) -> the replica asked to stop the lane there, or None when
        # the lane is not running elsewhere (set by the cluster service).
        self.abort_elsewhere: Any = None
        self.synthetic: Any = None  # gateway/cluster/synthetic.py SyntheticTurns

    def abort(self, key: str, *, drop_queued: bool = False,
              reason: str = "stop") -> dict[str, Any]:
        """``/stop``: here when the lane runs here, else on the replica that runs it."""
        if not self.local.is_busy(key) and self.abort_elsewhere is not None:
            replica = self.abort_elsewhere(key, drop_queued)
            if replica is not None:
                return {"aborted": True, "queued": 0, "dropped": 0, "replica": replica}
        return self.local.abort(key, drop_queued=drop_queued, reason=reason)

    def submit(self, key: str, payload: Any, **kw: Any) -> asyncio.Future:
        if isinstance(payload, SyntheticWork) and self.synthetic is not None \
                and not self.local.closed:
            return self.synthetic.submit(key, payload, kw)  # under the lane lease
        if isinstance(payload, UserWork) and payload.journal_id is not None \
                and not self.local.closed:
            return self.work.submit(key, payload, kw)
        if isinstance(payload, CommandWork) and not self.local.closed:
            return self._command(key, payload, kw)  # on the lane's replica
        if awaited(payload) and payload.journal_id is None and not self.local.closed \
                and self.work.forwarding is not None:
            return self._awaited(key, payload, kw)  # on the lane's replica
        return self.local.submit(key, payload, **kw)

    def _awaited(self, key: str, work: UserWork, kw: dict[str, Any]) -> asyncio.Future:
        """A message whose caller waits (CLI, control API, webchat, OpenAI API) on the
        lane of ``key`` wherever it runs; the future has the TurnResult (the holder's,
        relayed through PostgreSQL, when another replica runs the lane: its runtime
        events are re-emitted here under the same run id meanwhile)."""
        out: asyncio.Future = asyncio.get_running_loop().create_future()
        fwd = self.work.forwarding

        async def answer() -> None:
            row = None
            try:
                row = await fwd.insert(key, work)
                inner = self.work.submit(key, work, kw)
                self.work.watch(work, inner)  # run here: its row is done when it settles
                result = await inner
                if isinstance(result, Forwarded):
                    work.outcome = "forwarded"  # the holder records its one outcome
                    result = await fwd.result(row)
            except BaseException as exc:
                if not out.done():
                    out.set_exception(exc) if isinstance(exc, Exception) else out.cancel()
                raise
            finally:
                if row is not None:
                    fwd.forget(row)
            if not out.done():
                out.set_result(result)
        self.work._spawn(answer())
        return out

    def _command(self, key: str, work: CommandWork, kw: dict[str, Any]) -> asyncio.Future:
        """Run a session command on the lane of ``key`` wherever it runs; the future has
        its TurnResult (the holder's, when another replica runs the lane)."""
        out: asyncio.Future = asyncio.get_running_loop().create_future()
        inner = self.work.submit(key, work, kw)  # its row is written on the way

        async def answer() -> None:
            try:
                result = await inner
                if isinstance(result, Forwarded):
                    result = await commands.wait_result(self.work.db, int(work.journal_id or 0),
                                                        key, work.run_id)
            except BaseException as exc:
                if not out.done():
                    out.set_exception(exc) if isinstance(exc, Exception) else out.cancel()
                raise
            finally:
                self.work.watch(work, inner)  # type: ignore[arg-type]  # ran here: done
            if not out.done():
                out.set_result(result)
        self.work._spawn(answer())
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)
