"""Compaction inside a turn (seed 001 §2.5; runtime/compaction.py plans it): older context
summarised by the model when it nears the budget, or at once when the provider said the
context overflowed or the user sent ``/compact``. ``r`` is the turn's
:class:`runtime.turn.runner.AgentRunner`.
"""

from __future__ import annotations

from typing import Any

import structlog

from runtime.context.budget import CHARS_PER_TOKEN
from runtime.context.messages import private_view
from runtime.context.session_log import SessionLog
from runtime.turn.types import TurnInput

log = structlog.get_logger(__name__)

Runner = Any  # runtime.turn.runner.AgentRunner (not imported: it imports this module)


async def maybe_compact(r: Runner, inp: TurnInput, sink: SessionLog, n_new: int,
                        budget: int, force: bool = False) -> bool:
    """Summarise older context when it nears the budget (runtime/compaction.py), or
    (``force``: the provider said the context overflowed) now. True when compacted.

    This turn's ``n_new`` messages were already appended to ``sink`` (the newest cached
    entries) and are always kept."""
    cfg = r.settings.compaction
    threshold = 1e-9 if force else cfg.threshold
    if sink.tokens <= budget * threshold:  # O(1): the common case
        return False
    # the planner loads with the first session that nears its budget (issue 9, cold start)
    from runtime.compaction import SUMMARY_SHARE, plan_compaction, summary_request
    cached = sink.messages()
    plan = plan_compaction(cached, budget, threshold=threshold,
                           keep_ratio=cfg.keep_ratio)
    if plan is None or plan.keep_from > len(cached) - n_new:
        return False
    r.emit(inp, "auto_compaction_start", tokens_before=plan.tokens_before,
               messages=plan.keep_from)
    try:
        # the summary is shared by every later turn: no one's memory results go into it
        older = private_view(cached[:plan.keep_from], None)
        resp, _ = await r.caller.call(summary_request(older), model_override=inp.model)
        # Capped so the compacted context always ends well below the threshold.
        summary = resp.text.strip()[:int(budget * SUMMARY_SHARE) * CHARS_PER_TOKEN]
        if not summary:
            raise ValueError("empty summary")
    except Exception as exc:  # noqa: BLE001 - fall back to truncation
        log.warning("compaction_failed", session_key=inp.session_key, error=str(exc))
        r.emit(inp, "auto_compaction_end", ok=False, error=str(exc))
        return False
    entry = sink.apply_compaction(summary, plan.keep_from, plan.tokens_before)
    r.record(inp.session_id, "COMPACTION", {
        "summary": summary, "first_kept_entry_id": entry["firstKeptEntryId"],
        "tokens_before": plan.tokens_before, "tokens_after": sink.tokens,
        "messages_summarised": plan.keep_from})
    log.info("compacted", session_key=inp.session_key, tokens_before=plan.tokens_before,
             tokens_after=sink.tokens, messages_summarised=plan.keep_from)
    r.emit(inp, "auto_compaction_end", ok=True, tokens_after=sink.tokens)
    return True
