"""Subagents (seed 001 §6): child runs in ``agent:<agent>:subagent:<uuid>`` sessions on the
``subagent`` lane. ``config`` (limits and the subagent tool layer), ``records`` (run
records in ``<state_dir>/subagents/runs.json``), ``announce`` (telling the requester,
retries), ``expiry`` (announce expiry, hard expiry, orphans), ``service`` (the lifecycle).
"""
