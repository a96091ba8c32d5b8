"""A lean start (issue 9 "cold start to the first answer <= 1 s"): a gateway whose config
has no Slack/Telegram/Discord channel, no Anthropic provider and no MCP server starts and
answers a turn through the OpenAI-compatible provider without importing the libraries only
those need, nor the ones only a later tool call or a rendered reply needs (numpy/bm25s
for memory_search, markdown-it for platform markup, unidiff for apply_patch). Each is then
loaded when its feature is first used. Runs in a fresh interpreter and reads its
``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.helpers import ROOT

HEAVY = ["discord", "slack_bolt", "slack_sdk", "telegram", "openai", "anthropic", "httpx",
         "mcp", "numpy", "bm25s", "markdown_it", "unidiff", "PIL", "pypdf", "trafilatura",
         "lxml", "playwright"]

SCRIPT = textwrap.dedent("""
    import asyncio, json, sys, tempfile
    from pathlib import Path

    from tests.fakes.fake_openai import FakeOpenAI

    def loaded():
        return sorted({m.split(".")[0] for m in sys.modules})

    async def main():
        async with FakeOpenAI() as fake:
            from gateway.config.load import parse_config
            from gateway.service.daemon import Gateway
            state = Path(tempfile.mkdtemp())
            cfg = {"gateway": {"state_dir": str(state), "port": 0},
                   "skills": {"personal_dir": str(state / "personal-skills")},
                   "models": {"providers": {"fake": {
                       "api": "openai", "base_url": fake.base_url, "api_key": "sk-x"}}},
                   "agents": {"defaults": {"model": "fake/fake-model"}}}
            gw = Gateway(parse_config(cfg, "test", env={}))
            await gw.start()
            fake.script_text("**hello** there")
            result = await gw.local.send("hi")
            out = {"answer": result.text, "after_turn": loaded()}
            from channels.outbound.markup import to_telegram_html
            from runtime.memory import MemoryIndex
            from runtime.tools.patch import _plan
            (state / "ws").mkdir()
            (state / "ws" / "MEMORY.md").write_text("The deploy key lives in vault.")
            out["hits"] = len(MemoryIndex(state / "ws").search("deploy key", now=0))
            out["html"] = to_telegram_html("**bold**")
            try:
                _plan(state / "ws", "not a diff")
            except Exception as exc:
                out["patch_error"] = type(exc).__name__
            out["after_use"] = loaded()
            await gw.stop()
        print(json.dumps(out))

    asyncio.run(main())
""")


def test_default_start_and_turn_import_no_heavy_library():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["answer"] == "**hello** there"
    assert [m for m in HEAVY if m in out["after_turn"]] == []
    # ... and each is there once its feature is used
    assert out["hits"] == 1 and out["html"] == "<b>bold</b>"
    assert out["patch_error"] == "ToolError"
    assert {"bm25s", "numpy", "markdown_it", "unidiff"} <= set(out["after_use"])
