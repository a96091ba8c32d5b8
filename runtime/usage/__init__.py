"""Usage, cost and budgets: what every model call used and cost, kept in an append-only
ledger, and the daily/monthly budgets checked before every model call.

``pricing`` (built-in prices per million tokens, overridable in config), ``ledger``
(append-only JSONL usage records, queried by agent, session, model, channel and day),
``budget`` (spend per period in the budget's zone, alerts, refusals, operator overrides),
``config`` (the ``pricing`` and ``budgets`` config sections).
"""
