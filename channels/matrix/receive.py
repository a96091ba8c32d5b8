"""Inbound half of the Matrix adapter (``MatrixChannel`` in channels/matrix/adapter.py):
one ``/sync`` response -> invites answered, room events normalised
(channels/matrix/normalize.py) and handed to the gateway's callbacks, in stream order.

- **Invites** are accepted per the access policy: a direct-chat invite (``is_direct``)
  when the DM policy would let the inviter talk (``open``, ``pairing``, or listed in
  ``allow_from``); a room invite when the group policy allows that room (``open``, or
  its id in ``groups``). Any other invite is rejected (``matrix_invite_refused`` logged
  with the reason).
- **No gap**: a room whose timeline came back ``limited`` (more events since the last
  sync than ``timeline_limit``) is read back with ``/messages`` from the timeline's
  ``prev_batch`` down to the previous sync token, oldest first, before the timeline.
- A newly joined room starts at the bot's own join: what was said before it is history.
- A malformed event is logged and skipped; a gateway error never stops the sync loop.
"""

from __future__ import annotations

from typing import Any

import structlog

from channels.access.policy import check_access
from channels.base import InboundMessage
from channels.matrix.normalize import (
    RoomView,
    event_from_event,
    inbound_from_event,
    reply_target,
)

log = structlog.get_logger(__name__)

MAX_BACKFILL = 500  # events read back per room after a limited timeline


def _source(event: Any) -> dict[str, Any]:
    """The event's JSON. nio pops ``content`` out of the stripped invite-state events'
    ``source`` (kept as the ``content`` attribute): put it back."""
    src = getattr(event, "source", event)
    if not isinstance(src, dict):
        return {}
    content = getattr(event, "content", None)
    if "content" not in src and isinstance(content, dict):
        src = {**src, "content": content}
    return src


def _after_own_join(events: list[dict[str, Any]], user_id: str) -> tuple[list, bool]:
    """(events after the bot's last join in ``events``, whether it joined here)."""
    for i in range(len(events) - 1, -1, -1):
        ev = events[i]
        if (ev.get("type") == "m.room.member" and ev.get("state_key") == user_id
                and (ev.get("content") or {}).get("membership") == "join"):
            return events[i + 1:], True
    return events, False


class MatrixReceiving:
    """Mixin of MatrixChannel: the attributes used (``_client``, ``_identity``,
    ``_state``, ``_config``, ``_on_message``, ``_on_event``, ``_sent``, ``_clock``,
    ``account_id``, ``_fetcher``) are set by the adapter."""

    async def _handle_sync(self, resp: Any, *, since: str | None) -> None:
        """Hand over one sync response. ``since`` None: the first sync of a fresh
        account, whose timelines are history (skipped, counted in the log)."""
        for room_id, info in resp.rooms.invite.items():
            await self._on_invite(room_id, info)
        skipped = 0
        for room_id, info in resp.rooms.join.items():
            events = [_source(e) for e in info.timeline.events]
            events, joined_here = _after_own_join(events, self._identity.user_id)
            if since is None:
                skipped += len(events)
                continue
            if info.timeline.limited and not joined_here and info.timeline.prev_batch:
                events = await self._read_back(room_id, info.timeline.prev_batch,
                                               since) + events
            for event in events:
                await self._dispatch(room_id, event)
        if skipped:
            log.info("matrix_history_skipped", account_id=self.account_id, events=skipped,
                     reason="first sync of this account: earlier messages are not answered")

    async def _read_back(self, room_id: str, start: str, since: str) -> list[dict]:
        """Events between ``since`` and ``start`` (oldest first), at most MAX_BACKFILL."""
        from nio import MessageDirection, RoomMessagesResponse
        out: list[dict[str, Any]] = []
        token: str | None = start
        while token and len(out) < MAX_BACKFILL:
            resp = await self._client.room_messages(room_id, start=token, end=since,
                                                    direction=MessageDirection.back,
                                                    limit=100)
            if not isinstance(resp, RoomMessagesResponse) or not resp.chunk:
                break
            out.extend(_source(e) for e in resp.chunk)
            token = resp.end if resp.end != token else None
        if out:
            log.info("matrix_gap_read_back", account_id=self.account_id, room_id=room_id,
                     events=len(out))
        return list(reversed(out[:MAX_BACKFILL]))

    def _view(self, room_id: str) -> RoomView:
        room = self._client.rooms.get(room_id)
        names: dict[str, str] = {}
        if room is not None:
            names = {uid: u.display_name for uid, u in room.users.items() if u.display_name}
        return RoomView(room_id, room_id in self._state.direct_rooms, names,
                        self._sent.__contains__)

    async def _dispatch(self, room_id: str, event: dict[str, Any]) -> None:
        view = self._view(room_id)
        try:
            await self._learn_reply_target(room_id, event)
            inbound = inbound_from_event(event, view, self._identity,
                                         account_id=self.account_id,
                                         received_at=self._clock.time(),
                                         fetcher=self._fetcher)
            other = None if inbound else event_from_event(event, view, self._identity,
                                                          account_id=self.account_id)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            log.warning("matrix_event_malformed", account_id=self.account_id,
                        room_id=room_id, event_id=str(event.get("event_id")),
                        error=f"{type(exc).__name__}: {exc}"[:300])
            return
        try:
            if inbound is not None:
                if view.is_dm:
                    self._state.add_direct(room_id, inbound.sender_id)
                await self._on_message(inbound)
            elif other is not None:
                await self._on_event(other)
        except Exception:
            log.exception("matrix_handler_failed", account_id=self.account_id,
                          event_id=str(event.get("event_id")))

    async def _learn_reply_target(self, room_id: str, event: dict[str, Any]) -> None:
        """A reply to an event this process did not send (e.g. before a restart): ask the
        homeserver whether the bot sent it, so the reply counts as a mention."""
        content = event.get("content")
        target = reply_target(content) if isinstance(content, dict) else None
        if not target or target in self._sent or event.get("type") != "m.room.message":
            return
        from nio import RoomGetEventResponse
        resp = await self._client.room_get_event(room_id, target)
        if isinstance(resp, RoomGetEventResponse) and \
                resp.event.sender == self._identity.user_id:
            self._sent.add(target)

    async def _on_invite(self, room_id: str, info: Any) -> None:
        invite = next((e for e in map(_source, info.invite_state)
                       if e.get("type") == "m.room.member"
                       and e.get("state_key") == self._identity.user_id), {})
        inviter = str(invite.get("sender") or "")
        direct = bool((invite.get("content") or {}).get("is_direct"))
        probe = InboundMessage(channel="matrix", text="", sender_id=inviter or "?",
                               sender_username=inviter, account_id=self.account_id,
                               chat_type="dm" if direct else "group",
                               group_id=None if direct else room_id, mentions_bot=True)
        decision = check_access(probe, self._config)
        if decision.action == "ignore":
            log.info("matrix_invite_refused", account_id=self.account_id, room_id=room_id,
                     inviter=inviter, direct=direct, reason=decision.reason)
            await self._client.room_leave(room_id)
            return
        from nio import JoinResponse
        resp = await self._client.join(room_id)
        if not isinstance(resp, JoinResponse):
            log.warning("matrix_join_failed", account_id=self.account_id, room_id=room_id,
                        error=str(resp)[:300])
            return
        if direct and inviter:
            self._state.add_direct(room_id, inviter)
        log.info("matrix_invite_accepted", account_id=self.account_id, room_id=room_id,
                 inviter=inviter, direct=direct)
