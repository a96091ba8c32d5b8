"""The 24-hour customer service window, per WhatsApp user.

Meta lets a business send free-form messages to a user only within 24 hours of that
user's last message; outside it only an approved template may be sent (the Graph API
refuses anything else with error 131047). :class:`CustomerWindows` remembers when each
user last wrote, so a reply that would fall outside the window (an outbox retry a day
later, a cron job's delivery, a heartbeat alert) is turned into the configured template
or a clear refusal before it is sent.

The times live in one small JSON document ``{"last": {"<wa_id>": <epoch s>},
"template": {"<wa_id>": <epoch s>}}`` (``template``: when the window template was last
sent to that user, so it goes out once until they write again; a
``read() / write(bytes) / keep_aside()`` store: a file under ``<state_dir>/channels/``),
so the window survives a restart. A corrupt document is kept aside and reported; the
channel then starts with no known windows (replies go out as templates or are refused
until each user writes again) instead of failing.
"""

from __future__ import annotations

import json
from typing import Any

import structlog

from runtime.clock import Clock
from runtime.state_files import report_corrupt

log = structlog.get_logger(__name__)

MAX_USERS = 50_000  # past this, closed windows are dropped first, then the oldest


class CustomerWindows:
    """``document``: the store (None: in memory only); ``hours``: the window's length;
    ``problems``: where a corrupt document is reported."""

    def __init__(self, document: Any, clock: Clock, *, hours: float = 24.0,
                 problems: list[str] | None = None, max_users: int = MAX_USERS) -> None:
        self.document = document
        self.max_users = max_users
        self.clock = clock
        self.seconds = hours * 3600.0
        self._last: dict[str, float] = {}
        self._template: dict[str, float] = {}
        self._problems = problems
        self._load()

    def _load(self) -> None:
        raw = self.document.read() if self.document is not None else None
        if raw is None:
            return
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            self._last = {str(k): float(v) for k, v in (data.get("last") or {}).items()}
            self._template = {str(k): float(v)
                              for k, v in (data.get("template") or {}).items()}
        except (ValueError, TypeError, AttributeError) as exc:
            self.document.keep_aside()
            report_corrupt("whatsapp windows", getattr(self.document, "path", "document"),
                           str(exc), effect="every user's 24-hour window counts as closed "
                           "until they write again", fix="nothing: the file is rewritten "
                           "with the next message", problems=self._problems)

    def _bound(self) -> None:
        """At most ``max_users`` entries: closed windows go first, then the oldest."""
        if len(self._last) <= self.max_users:
            return
        cutoff = self.clock.time() - self.seconds
        live = {k: v for k, v in self._last.items() if v > cutoff}
        if len(live) > self.max_users:
            live = dict(sorted(live.items(), key=lambda kv: kv[1])[-self.max_users:])
        self._last = live
        self._template = {k: v for k, v in self._template.items() if k in self._last}

    def save(self) -> None:
        """Write the document (bounded first)."""
        self._bound()
        if self.document is None:
            return
        doc = {"last": self._last, "template": self._template}
        self.document.write(json.dumps(doc, separators=(",", ":")).encode())

    _save = save

    def opened(self, wa_id: str, at: float, *, save: bool = True) -> bool:
        """``wa_id`` wrote at ``at`` (epoch s): the window runs until ``at`` + hours.
        ``save=False``: in memory only, until :meth:`save` (or :meth:`restore`).
        Returns whether anything changed."""
        if at > self._last.get(wa_id, 0.0):
            self._last[wa_id] = at
            if save:
                self.save()
            return True
        return False

    def restore(self, wa_id: str, last: float | None) -> None:
        """Undo an unsaved :meth:`opened`: ``wa_id``'s last message is ``last`` again
        (None: unknown) — for a sender the access policy refused."""
        if last is None:
            self._last.pop(wa_id, None)
        else:
            self._last[wa_id] = last

    def closed(self, wa_id: str) -> None:
        """Meta said the window is closed (131047): forget the user's last message."""
        if self._last.pop(wa_id, None) is not None:
            self._save()

    def last_message(self, wa_id: str) -> float | None:
        return self._last.get(wa_id)

    def is_open(self, wa_id: str) -> bool:
        last = self._last.get(wa_id)
        return last is not None and self.clock.time() - last < self.seconds

    def template_sent(self, wa_id: str) -> bool:
        """Whether the window template went to ``wa_id`` after their last message."""
        sent = self._template.get(wa_id)
        return sent is not None and sent >= self._last.get(wa_id, 0.0)

    def note_template(self, wa_id: str) -> None:
        self._template[wa_id] = self.clock.time()
        self._save()
