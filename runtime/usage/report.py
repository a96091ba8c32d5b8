"""Usage reports: records grouped by agent, session, model, channel or day, with totals.
Used by ``tidegate usage``, ``/usage`` in chat, ``GET /api/usage`` and the control UI."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

GROUPS = ("agent", "session", "model", "channel", "day")


def _key(rec: dict[str, Any], by: str, tz: ZoneInfo) -> str:
    if by == "day":
        return datetime.fromtimestamp(rec["_t"], tz).strftime("%Y-%m-%d")
    if by == "session":
        return str(rec.get("session_key") or "-")
    if by == "model":
        return f"{rec.get('provider')}/{rec.get('model')}"
    return str(rec.get(by) or "-")


def summarize(records: Iterable[dict[str, Any]], by: str = "model",
              tz: str = "UTC") -> dict[str, Any]:
    """``{"by", "rows": [{key, calls, input, output, cache_read, cost_usd}], "total": {...},
    "unpriced": [models]}``; rows sorted by cost, then calls (descending). Raises
    ValueError for an unknown ``by``."""
    if by not in GROUPS:
        raise ValueError(f"by must be one of {', '.join(GROUPS)}")
    zone = ZoneInfo(tz)
    rows: dict[str, dict[str, Any]] = {}
    total = _zero("total")
    unpriced: set[str] = set()
    for rec in records:
        row = rows.setdefault(_key(rec, by, zone), _zero(_key(rec, by, zone)))
        for target in (row, total):
            target["calls"] += 1
            for k in ("input", "output", "cache_read"):
                target[k] += int(rec.get(k) or 0)
            target["cost_usd"] += float(rec.get("cost_usd") or 0.0)
        if rec.get("priced") is False and rec.get("provider") != "echo":  # built-in: free
            unpriced.add(f"{rec.get('provider')}/{rec.get('model')}")
    ordered = sorted(rows.values(), key=lambda r: (r["key"] if by == "day" else "",
                                                   -r["cost_usd"], -r["calls"]))
    for r in [*ordered, total]:
        r["cost_usd"] = round(r["cost_usd"], 6)
    return {"by": by, "rows": ordered, "total": total, "unpriced": sorted(unpriced)}


def _zero(key: str) -> dict[str, Any]:
    return {"key": key, "calls": 0, "input": 0, "output": 0, "cache_read": 0, "cost_usd": 0.0}


def render(report: dict[str, Any], title: str = "") -> str:
    """A plain-text table of :func:`summarize`'s result."""
    head = (report["by"].upper(), "CALLS", "IN", "OUT", "CACHED", "COST USD")
    body = [(r["key"], str(r["calls"]), str(r["input"]), str(r["output"]),
             str(r["cache_read"]), f"{r['cost_usd']:.4f}") for r in report["rows"]]
    t = report["total"]
    body.append(("total", str(t["calls"]), str(t["input"]), str(t["output"]),
                 str(t["cache_read"]), f"{t['cost_usd']:.4f}"))
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = [title] if title else []
    for row in [head, *body]:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))
    if report["unpriced"]:
        lines.append("no price for: " + ", ".join(report["unpriced"]) +
                     " (add them under pricing: in config.yaml)")
    return "\n".join(lines)
