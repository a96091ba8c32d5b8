"""The timeline on PostgreSQL (issue 15): the store (``store.py``), its group commit
(``batch.py``) and the chain rules shared by both (``chain.py``)."""

from runtime.storage.postgres.timeline.store import TRIGGERS, PgTimelineStore

__all__ = ["TRIGGERS", "PgTimelineStore"]
