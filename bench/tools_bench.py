"""Tool policy and skills benchmark (issue 11; DESIGN.md "Performance").

Run: ``.venv/bin/python bench/tools_bench.py [--skills 151]``

Reports (targets in brackets):

- policy pipeline for one scope: first resolution and the cached lookup every turn does
  [cached < 5 µs]
- skills: first scan + render of ``--skills`` workspace skills (plus the bundled ones)
  [< 200 ms], the per-check signature (stat of every SKILL.md, run at most once a second
  per agent) [< 5 ms], the whole per-turn prefix check a turn pays when that second has
  passed (bootstrap files + skills signature, nothing changed) [≤ 5 ms], and the prompt's
  stable prefix on a cache hit [< 5 µs]. The source directories are backdated one minute
  (a gateway's steady state: directories listed fresh within 2 s of a change are listed
  again, see runtime/skills/signature.py); ``fresh`` is the figure without that.

Not a timed test: it prints figures. Uses a temp dir; touches nothing else.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

import structlog

from gateway.config.load import parse_config
from gateway.tools.policy import build_policy
from runtime.clock import SYSTEM_CLOCK
from runtime.prompt import Identity, PromptBuilder
from runtime.skills.catalog import SkillCatalog
from runtime.tools.policy import ToolScope
from runtime.tools.sources import builtin_registry


def per_call_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def bench_policy() -> None:
    cfg = parse_config({"tools": {"allow": ["*", "!exec"]}, "channels": {"discord": {
        "groups": {"G1": {"tools": {"deny": ["write", "group:sessions"]}}}}}}, "bench",
        env={}).config
    policy = build_policy(cfg, builtin_registry())
    scope = ToolScope("main", "echo", channel="discord", chat_type="group", group_id="G1")
    t0 = time.perf_counter()
    res = policy.resolve(scope)
    first = (time.perf_counter() - t0) * 1e6
    cached = per_call_us(lambda: policy.resolve(scope), 100_000)
    print(f"policy: {len(res.tools)} tools kept, {len(res.removed)} removed; first "
          f"{first:.0f} µs, cached {cached:.2f} µs/turn [< 5 µs]")


def bench_skills(count: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        for i in range(count):
            md = ws / "skills" / f"s{i:03d}" / "SKILL.md"
            md.parent.mkdir(parents=True)
            md.write_text(f"---\nname: s{i:03d}\ndescription: skill {i} {'x' * 220}\n---\n"
                          f"Body of skill {i}.\n")
        catalog = SkillCatalog.for_workspace(ws, extra=[], managed=None, personal=None)
        t0 = time.perf_counter()
        section = catalog.section()
        first = (time.perf_counter() - t0) * 1e3
        fresh = per_call_us(catalog.signature, 200) / 1000
        old = time.time() - 60
        for d in [ws / "skills", *(ws / "skills").iterdir()]:
            os.utime(d, (old, old))
        sig = per_call_us(catalog.signature, 200) / 1000
        prompt = PromptBuilder(identity=Identity("main"), workspace=ws, tool_lines=[],
                               skills=catalog, clock=SYSTEM_CLOCK)
        prompt.stable_prefix()
        hit = per_call_us(prompt.stable_prefix, 100_000)
        prompt.check_interval = 0.0  # every call re-checks, as the first turn after 1 s
        check = per_call_us(prompt.stable_prefix, 200) / 1000
        print(f"skills: {count} + bundled, {len(section.included)} in the prompt "
              f"({len(section.text)} chars, cut {section.cut_by_count} by count, "
              f"{section.cut_by_chars} by chars); first scan+render {first:.1f} ms "
              f"[< 200 ms], signature {sig:.2f} ms (fresh {fresh:.2f} ms) [< 5 ms], per-turn "
              f"check {check:.2f} ms [≤ 5 ms], prefix hit {hit:.2f} µs [< 5 µs]")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skills", type=int, default=151)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    bench_policy()
    bench_skills(args.skills)


if __name__ == "__main__":
    main()
